"""The links a server's KV loads take from the tiers below its GPU KV (``Scheduler.kv_links``):
one per tier, each carrying one load at a time, first come first served, for
``bytes / bandwidth + latency``. A request that loads from several tiers loads from each at
once, over its own link, and may be scheduled when the last of its loads ends. Stores travel
the other way (PCIe and network links are full duplex) and vLLM issues them asynchronously,
so they hold up neither loads nor steps here."""

from __future__ import annotations


class KVLoads:
    """FIFO links, one per tier, and when each is next free."""

    def __init__(self, links: list[tuple[float, float] | None]) -> None:
        self.links = links
        """Per tier: (bytes per second, seconds of latency per load), or None (no tier)."""
        self.free_at = [0.0] * len(links)
        """Per tier: when the load in hand (if any) ends."""

    def book(self, now: float, nbytes: list[int]) -> float:
        """Queue the loads of one request (``nbytes`` per tier) ready at ``now`` behind those
        booked before: when the last of them ends."""
        end = now
        for t, b in enumerate(nbytes):
            if not b:
                continue
            link = self.links[t]
            assert link is not None, "a load from a tier the server has no link to"
            bandwidth, latency = link
            done = max(now, self.free_at[t]) + b / bandwidth + latency
            self.free_at[t] = done
            end = max(end, done)
        return end
