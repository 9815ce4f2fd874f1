"""The link that carries KV caches from prefill to decode replicas: one transfer at a time,
first come first served."""

from __future__ import annotations


class KVLink:
    """A FIFO link: a transfer takes ``bytes / bandwidth + latency`` once the link is free."""

    def __init__(self, bandwidth_bytes_per_s: float, latency_s: float) -> None:
        self.bandwidth = bandwidth_bytes_per_s
        """Bytes per second."""
        self.latency = latency_s
        """Fixed seconds per transfer."""
        self.free_at = 0.0
        """When the transfer in hand (if any) ends."""
        self.num_transfers = 0
        """Transfers booked so far."""

    def transfer_time(self, num_bytes: float) -> float:
        """Seconds one transfer of ``num_bytes`` holds the link."""
        return num_bytes / self.bandwidth + self.latency

    def book(self, now: float, num_bytes: float) -> tuple[float, float]:
        """Queue a transfer ready at ``now`` behind those booked before it: ``(start, end)``."""
        start = max(now, self.free_at)
        end = start + self.transfer_time(num_bytes)
        self.free_at = end
        self.num_transfers += 1
        return start, end
