"""The loads of the step scheduler from KV tiers below the GPU's (``offload.py``): a waiting
sequence whose prefix goes on in a tier holds GPU blocks for it and waits, out of the queue,
while its KV comes over the tier's link; then it goes back to the head of the queue, where
its lookup hits the loaded blocks in GPU KV. This is vLLM's asynchronous load
(``get_num_new_matched_tokens`` returning ``load_kv_async``, the request in
``WAITING_FOR_REMOTE_KVS`` skipped by the scheduler until the worker reports the load
finished), so the steps of the others go on meanwhile and the load costs the request its
wait, not the batch a longer step. The engine times the load (``Scheduler.kv_links``)."""

from __future__ import annotations

from mypy_extensions import mypyc_attr, trait

from simulator.scheduling.interface import StepPlan, TierLoad
from simulator.scheduling.kv_manager import KVManager
from simulator.scheduling.kv_tier import KVTier
from simulator.scheduling.offload import Offload
from simulator.scheduling.request_queue import FCFSQueue, PriorityQueue
from simulator.scheduling.sequence import Sequence


@trait  # a part of StepScheduler (mypyc: one of its several bases)
@mypyc_attr(allow_interpreted_subclasses=True)
class TierLoads:
    """Loads from the KV tiers of a policy whose ``blocks`` have a prefix cache."""

    blocks: KVManager
    waiting: FCFSQueue | PriorityQueue
    _loading: set[Sequence]
    _memo: tuple[Sequence, frozenset[int] | None, list[int]] | None  # DeferredDecodes'

    def attach_tier(
        self, tier: KVTier, bytes_per_block: int, bandwidth_bytes_s: float, latency_s: float
    ) -> None:
        """Put ``tier`` below the GPU's KV (blocks of ``bytes_per_block``), over a link of
        ``bandwidth_bytes_s`` with ``latency_s`` per load."""
        blocks = self.blocks
        refusal = blocks.refuses("KV tiers")
        if refusal is not None:
            raise ValueError(refusal)
        if not blocks.caching:
            raise ValueError("KV tiers need prefix caching on (blocks are found by content)")
        if blocks.offload is None:
            blocks.offload = Offload(bytes_per_block)
        elif blocks.offload.bytes_per_block != bytes_per_block:
            raise ValueError("every tier of a replica has its blocks' size")
        blocks.offload.attach(tier, bandwidth_bytes_s, latency_s)

    @property
    def moves_kv(self) -> bool:
        """Whether KV tiers are attached."""
        return self.blocks.offload is not None

    @property
    def num_loading(self) -> int:
        """Sequences waiting for their load to end."""
        return len(self._loading)

    def kv_links(self) -> list[tuple[float, float] | None]:
        """Per tier: its link's (bytes per second, latency), or None."""
        off = self.blocks.offload
        return [] if off is None else list(off.links)

    def take_kv_moved(self) -> tuple[int, ...]:
        """Bytes stored to and loaded from each tier since the last call."""
        off = self.blocks.offload
        return (0, 0, 0, 0) if off is None else off.take_moved()

    def _hold_for_load(self, seq: Sequence, hits: list[int], plan: StepPlan) -> bool | None:
        """If the tiers go on with the prefix of waiting head ``seq`` after its GPU ``hits``:
        hold its blocks and start the load (True), or find them missing (False); None when
        no tier has more of it."""
        blocks = self.blocks
        counts = blocks.tier_hits(seq, len(hits))
        num = sum(counts)
        if not num:
            return None
        assert blocks.offload is not None
        if blocks.offload.in_flight(seq.block_hashes[len(hits) : len(hits) + num]):
            return False  # wait for that load, then hit its blocks in GPU KV (as vLLM delays)
        if not blocks.hold(seq, hits, num):
            return False
        self.waiting.pop()
        self._loading.add(seq)
        nbytes = blocks.offload.load(seq, counts, seq.num_blocks)
        bs = blocks.block_size
        load = TierLoad(seq, [k * bs for k in counts], nbytes)
        if plan.loads:
            plan.loads.append(load)
        else:
            plan.loads = [load]
        return True

    def finish_load(self, seq: Sequence) -> None:
        """``seq``'s load ended: its blocks are cached in GPU KV, and it is queued at the
        head, where its lookup hits them (vLLM keeps its place in the queue, which is at the
        head here: only the head starts a load). vLLM schedules it with the blocks it holds;
        here they wait in the cache, at the tail of the eviction order, so that a sequence
        preempted meanwhile, queued ahead of it, never waits for blocks it holds."""
        self._loading.remove(seq)
        self.blocks.loaded(seq)
        self._memo = None  # the head's hit changed
        self.waiting.prepend(seq)
