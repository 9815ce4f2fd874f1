"""The drafter's time in a step of speculative decoding: ``k`` forward passes of the draft
model (MTP layers, an EAGLE head, a small model) over the sequences that sample in the step,
each pass priced as ``draft_cost`` times the target model's decode step over the same
sequences (one token each, on their KV after the step). ngram drafting costs nothing here
(its lookup runs on the CPU, inside the step's CPU time)."""

from __future__ import annotations

from simulator.cost.batch import Batch
from simulator.cost.interface import CostModel
from simulator.scheduling.interface import StepPlan


class DraftCost:
    """Seconds the drafter adds to a planned step."""

    def __init__(self, gpu: CostModel, num_speculative_tokens: int, draft_cost: float) -> None:
        self._gpu = gpu
        self._passes = num_speculative_tokens
        self._share = draft_cost

    def time(self, plan: StepPlan) -> float:
        """The drafter's seconds for ``plan`` (before it is applied): ``k`` passes over the
        sequences that will sample, at ``draft_cost`` of the target's decode step each."""
        if not self._passes or not self._share:
            return 0.0
        # async plans know who samples; a sync plan's sequence does when it reaches its end
        sampling = plan.sampling
        rows = zip(plan.seqs, plan.num_new_tokens, plan.context_lens, strict=True)
        if sampling:
            contexts = [c + n for seq, n, c in rows if seq in sampling]
        else:
            contexts = [c + n for seq, n, c in rows if c + n >= seq.num_tokens]
        if not contexts:
            return 0.0
        one = self._gpu.step_time(Batch([1] * len(contexts), contexts))
        return self._passes * self._share * one
