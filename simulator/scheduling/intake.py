"""How sequences enter the step scheduler: checked against the cache, then queued (new, or
arriving with their prompt computed elsewhere)."""

from __future__ import annotations

from mypy_extensions import mypyc_attr, trait

from simulator.scheduling.encoder_inputs import EncoderInputs
from simulator.scheduling.kv_manager import KVManager
from simulator.scheduling.request_queue import FCFSQueue, PriorityQueue
from simulator.scheduling.sequence import Sequence, SequenceStatus


def positive(name: str, value: int) -> int:
    """``value`` if it is a positive int, else a ValueError naming ``name`` (the scheduler's
    sizes and budgets)."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_flags(
    long_prefill_token_threshold: int, sample_fn: object, eos_token_id: int | None
) -> None:
    """A ValueError for a negative prefill cap, or an EOS token without a sampler to reveal it."""
    if long_prefill_token_threshold < 0:
        raise ValueError("long_prefill_token_threshold must be >= 0")
    if sample_fn is None and eos_token_id is not None:
        raise ValueError("eos_token_id needs a sample_fn (only sampling can reveal an EOS)")


@trait  # a part of StepScheduler (mypyc: one of its several bases)
@mypyc_attr(allow_interpreted_subclasses=True)
class Intake:
    """``add()`` and ``add_prefilled()`` of the scheduler (mixed into ``StepScheduler``)."""

    blocks: KVManager
    max_model_len: int
    """Most tokens a request may ask for, prompt and output together, as vLLM's server
    refuses more (``scheduler.max_model_len``; 0: no limit)."""
    waiting: FCFSQueue | PriorityQueue
    encoder: EncoderInputs | None
    max_num_batched_tokens: int
    _known: set[int]
    _num_added: int
    # the last sequence ``rejection_reason`` found to fit: the engine asks before every
    # ``add``, which need not work it out again
    _fits: Sequence | None = None

    def rejection_reason(self, seq: Sequence) -> str | None:
        """Why ``seq`` can never be served (it asks for more than ``max_model_len`` tokens, or
        its largest KV footprint exceeds the cache), or None."""
        limit = self.max_model_len
        if limit and seq.prompt_len + seq.max_tokens > limit:
            return (
                f"asks for {seq.prompt_len + seq.max_tokens} tokens (prompt {seq.prompt_len} "
                f"+ output {seq.max_tokens}), more than max_model_len {limit}"
            )
        if seq.mm_items:
            reason = self._mm_reason(seq)
            if reason is not None:
                return reason
        need = self.blocks.blocks_for(seq.max_kv_tokens)
        if need <= self.blocks.num_blocks:
            self._fits = seq
            return None
        return (
            f"needs {need} KV blocks for {seq.max_kv_tokens} tokens (prompt {seq.prompt_len} "
            f"+ output {seq.max_tokens} - 1), cache has {self.blocks.num_blocks}"
        )

    def _mm_reason(self, seq: Sequence) -> str | None:
        """Why ``seq``'s multimodal items can never be encoded here, or None."""
        if self.encoder is None:
            return "has multimodal items, but the scheduler has no encoder cache"
        # vLLM refuses the same (compute_mm_encoder_budget); long_prefill_token_threshold caps
        # a chunk only while others run or wait, so a chunk may still reach the budget
        return self.encoder.rejection_reason(seq, self.max_num_batched_tokens)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (behind earlier ones of its priority)."""
        if seq.num_output:
            raise ValueError(f"sequence {seq.seq_id!r} is not new (status {seq.status.value})")
        self._enqueue(seq)

    def add_prefilled(self, seq: Sequence) -> None:
        """Queue a sequence that arrives with its prompt computed elsewhere (the KV of every
        token but its last sampled one). It is admitted like any other, when the blocks for
        that KV are free, and decodes its next token in that step; a later preemption drops
        the KV as usual and recomputes it here."""
        if not seq.output:
            raise ValueError(f"sequence {seq.seq_id!r} has sampled no token: not prefilled")
        if self.blocks.caching:
            # admission starts from a cache lookup, which knows nothing of KV that came in
            raise ValueError("prefilled sequences need prefix caching off")
        self._enqueue(seq)
        seq.num_computed = seq.num_tokens - 1

    def _enqueue(self, seq: Sequence) -> None:
        if seq.seq_id in self._known:
            raise ValueError(f"sequence {seq.seq_id!r} was already added")
        if seq.status is not SequenceStatus.WAITING or seq.num_computed:
            raise ValueError(f"sequence {seq.seq_id!r} is not new (status {seq.status.value})")
        if seq is not self._fits:
            reason = self.rejection_reason(seq)
            if reason is not None:
                raise ValueError(f"sequence {seq.seq_id!r} can never fit: {reason}")
        self._fits = None
        self._known.add(seq.seq_id)
        if seq.mm_items and self.encoder is not None:
            self.encoder.pending.add(seq)
        seq.arrival_order = self._num_added
        self._num_added += 1
        self.waiting.add(seq)
