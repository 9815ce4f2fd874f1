"""One replica of a cluster: a server, and the counters a router may read of it."""

from __future__ import annotations

from simulator.engine.server_shape import ServerShape
from simulator.scheduling.sequence import Sequence


class Replica:
    """A server of the cluster, seen by a router as a step-by-step run shows it now."""

    def __init__(self, index: int, group: str, role: str, server: ServerShape) -> None:
        self.index = index
        """Position in the cluster (the ``replica`` column)."""
        self.group = group
        """Name of its replica group."""
        self.role = role
        """``colocated``, ``prefill`` or ``decode``."""
        self.server = server
        """Its scheduler, cost model and step loop."""
        self._incoming = 0
        self.num_routed = 0
        """Requests routed here so far."""
        self.num_outstanding = 0
        """Requests routed here and not finished: running, waiting, or with KV on the way.
        A plain number, kept as they come (``submit``, ``num_incoming``) and go
        (``finished``): the scheduler's running plus waiting plus ``num_incoming`` at every
        instant a router reads it, without asking the scheduler each time."""
        self._owed = 0  # prompt + output tokens to sample, of the requests routed here, less
        # the prompt tokens of those finished here
        self._num_blocks = server.num_blocks  # fixed: read at every routing by ``least_kv``

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
        return self.server.num_blocks_used / self._num_blocks

    @property
    def num_tokens(self) -> int:
        """Tokens of work in flight: prompt plus output still to sample, over the outstanding
        requests."""
        return self._owed - self.server.num_sampled

    @property
    def num_incoming(self) -> int:
        """Requests routed here whose KV is still on the link."""
        return self._incoming

    @num_incoming.setter
    def num_incoming(self, num: int) -> None:
        self.num_outstanding += num - self._incoming
        self._incoming = num

    # -- bookkeeping by the cluster --------------------------------------------------------

    def routed(self, prompt_len: int, num_to_sample: int) -> None:
        """A request is on its way here, with ``num_to_sample`` tokens left to sample here."""
        self.num_routed += 1
        self._owed += prompt_len + num_to_sample

    def submit(self, seq: Sequence, prefilled: bool = False) -> None:
        """Hand ``seq`` to the server (``ServerShape.submit``); outstanding unless refused."""
        if self.server.submit(seq, prefilled):
            self.num_outstanding += 1

    def finished(self, num: int, prompt_tokens: int) -> None:
        """``num`` requests with ``prompt_tokens`` prompt tokens in all finished here (or
        left it, prefilled, for a decode replica)."""
        self.num_outstanding -= num
        self._owed -= prompt_tokens
