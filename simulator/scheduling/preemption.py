"""What preemption does with a victim's KV (``scheduler.preemption_mode``, docs/swap.md):

- ``recompute`` (vLLM v1, the only mode there): drop it; the victim goes back to the head of
  the waiting queue with its output, and computes its prompt and output again when admitted;
- ``swap`` (vLLM v0's ``--preemption-mode swap``: ``_preempt_by_swap``, ``_swap_out``,
  ``_swap_in``): copy the blocks holding its computed tokens to CPU memory (``SwapSpace``) and
  free them on the GPU; at the start of phase 2 of a step that preempted nobody, swapped
  sequences resume in order, each when blocks for its KV and its next tokens are free, by
  copying the KV back: nothing is computed again. New sequences are admitted only once none is
  swapped out (a swapped head that does not fit blocks those behind it, as the waiting head
  does). When the swap space cannot hold a victim's blocks it is recomputed (vLLM v0 aborted
  the engine instead, ``Aborted due to the lack of CPU swap space``).

The copies are timed by the engine on the step whose plan made them (``take_swapped``), as
vLLM v0's worker ran ``blocks_to_swap_out`` and ``blocks_to_swap_in`` before the step's
forward pass.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr, trait

from simulator.scheduling.encoder_inputs import EncoderInputs
from simulator.scheduling.interface import StepPlan
from simulator.scheduling.kv_manager import KVManager
from simulator.scheduling.request_queue import FCFSQueue, PriorityQueue
from simulator.scheduling.sequence import Sequence, SequenceStatus
from simulator.scheduling.swap_space import SwapSpace


@trait  # a part of StepScheduler (mypyc: one of its several bases)
@mypyc_attr(allow_interpreted_subclasses=True)
class Preemption:
    """Recompute or swap preemption, and the resumption of swapped sequences."""

    blocks: KVManager
    waiting: FCFSQueue | PriorityQueue
    _running: list[Sequence]
    _num_preemptions: int
    max_num_seqs: int
    priority: bool
    swap: SwapSpace | None
    encoder: EncoderInputs | None
    num_speculative_tokens: int  # Speculation's
    async_scheduling: bool

    def enable_swap(self, num_cpu_blocks: int, bytes_per_block: int, bandwidth: float) -> None:
        """Preempt by swapping to ``num_cpu_blocks`` CPU blocks of ``bytes_per_block`` bytes
        over a host link of ``bandwidth`` bytes per second (recomputing when they are full)."""
        if self.num_speculative_tokens or self.async_scheduling:
            raise ValueError("swap preemption is not simulated with drafts or async scheduling")
        if self.blocks.offload is not None:
            raise ValueError("swap preemption is not simulated with KV tiers")
        refusal = self.blocks.refuses("swap preemption")
        if refusal is not None:
            raise ValueError(refusal)
        self.swap = SwapSpace(num_cpu_blocks, bytes_per_block, bandwidth, self.priority)

    @property
    def num_swapped(self) -> int:
        """Sequences swapped out to CPU memory now (in ``num_waiting`` too)."""
        return 0 if self.swap is None else len(self.swap.queue)

    @property
    def swap_bandwidth(self) -> float | None:
        """Bytes per second the swap copies take (None: recompute preemption)."""
        return None if self.swap is None else self.swap.bandwidth

    def take_swapped(self) -> tuple[int, int]:
        """KV bytes swapped out and in by the plans since the last call."""
        return (0, 0) if self.swap is None else self.swap.take_moved()

    def _can_defer(self) -> bool:
        # the deferred decode group leaves swapped sequences out of its steps (they resume in
        # phase 2): with swap preemption every step goes through schedule()
        return self.swap is None and super()._can_defer()  # type: ignore[misc]

    def _swap_or_recompute(self, seq: Sequence) -> None:
        """Preempt a running ``seq``: swap its KV out if there is a swap space with room for
        it, else recompute (drop the KV, keep the output, back to the head of waiting); what
        ``StepScheduler._preempt``, the hook, does."""
        self._running.remove(seq)
        if self.encoder is not None and seq.mm_items:  # its encoder cache references go
            self.encoder.drop(seq, preempted=True)
        swap = self.swap
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self._num_preemptions += 1
        c = seq.num_computed
        if swap is not None and c and swap.swap_out(seq, self.blocks.blocks_for(c)):
            self.blocks.free(seq)  # its KV goes on in CPU memory: num_computed stays
            return
        self.blocks.free(seq)
        seq.num_computed = 0
        seq.spec_drafts = seq.placeholders = 0
        seq.stale = seq.in_flight  # async: the output in flight still comes
        self.waiting.prepend(seq)

    def _resume_swapped(self, plan: StepPlan, budget: int, cap: int) -> int:
        """Phase 2's first part, in a step that preempted nobody: swap sequences back in
        from the head of the swap queue, each with its next tokens (capped), while budget,
        ``max_num_seqs`` and GPU blocks last; returns the budget left."""
        swap = self.swap
        if swap is None or plan.preempted:
            return budget
        queue, running, blocks = swap.queue, self._running, self.blocks
        while queue and budget > 0 and len(running) < self.max_num_seqs:
            seq = queue[0]
            c = seq.num_computed
            n = seq.num_tokens - c
            if 0 < cap < n:
                n = cap
            if n > budget:
                n = budget
            if not blocks.grow(seq, c + n):
                break
            swap.swap_in()
            running.append(seq)
            seq.status = SequenceStatus.RUNNING
            plan.seqs.append(seq)
            plan.num_new_tokens.append(n)
            plan.context_lens.append(c)
            budget -= n
        return budget
