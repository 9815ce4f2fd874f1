"""One replica of a cluster: a server, and the counters a router may read of it."""

from __future__ import annotations

from simulator.engine.server import Server


class Replica:
    """A server of the cluster, seen by a router as a step-by-step run shows it now."""

    def __init__(self, index: int, group: str, role: str, server: Server) -> None:
        self.index = index
        """Position in the cluster (the ``replica`` column)."""
        self.group = group
        """Name of its replica group."""
        self.role = role
        """``colocated``, ``prefill`` or ``decode``."""
        self.server = server
        """Its scheduler, cost model and step loop."""
        self.num_incoming = 0
        """Requests routed here whose KV is still on the link."""
        self.num_routed = 0
        """Requests routed here so far."""
        self._work = 0  # prompt + output tokens to sample, of every request routed here
        self._done_prompt = 0  # prompt tokens of the requests finished here

    # -- what a router reads ---------------------------------------------------------------

    @property
    def num_running(self) -> int:
        """Sequences running."""
        return self.server.num_running

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission."""
        return self.server.num_waiting

    @property
    def num_blocks_used(self) -> int:
        """KV blocks held."""
        return self.server.num_blocks_used

    @property
    def num_blocks(self) -> int:
        """KV blocks in its cache."""
        return self.server.num_blocks

    @property
    def kv_utilization(self) -> float:
        """Share of its KV blocks held."""
        return self.server.num_blocks_used / self.server.num_blocks

    @property
    def num_outstanding(self) -> int:
        """Requests routed here and not finished: running, waiting, or with KV on the way."""
        return self.server.num_running + self.server.num_waiting + self.num_incoming

    @property
    def num_tokens(self) -> int:
        """Tokens of work in flight: prompt plus output still to sample, over the outstanding
        requests."""
        return self._work - self._done_prompt - self.server.num_sampled

    # -- bookkeeping by the cluster --------------------------------------------------------

    def routed(self, prompt_len: int, num_to_sample: int) -> None:
        """A request is on its way here, with ``num_to_sample`` tokens left to sample here."""
        self.num_routed += 1
        self._work += prompt_len + num_to_sample

    def finished(self, prompt_tokens: int) -> None:
        """Requests with ``prompt_tokens`` prompt tokens in all finished here."""
        self._done_prompt += prompt_tokens
