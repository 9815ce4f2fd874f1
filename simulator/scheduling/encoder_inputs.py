"""Multimodal encoder inputs in the step (vLLM v1's ``_try_schedule_encoder_inputs`` and
``_free_encoder_inputs``, docs/multimodal.md).

A chunk ``[computed, computed + n)`` of a prompt needs the encoder output of every item whose
placeholders it overlaps. An item already encoded (in the cache, or scheduled for another
sequence in this step) costs nothing; else it is encoded in this step, its whole length charged
to the step's encoder budget (``max_num_encoder_input_tokens``) however little of it the chunk
covers, if the budget and the encoder cache have room. If not, the chunk is cut to end just
before the item (to nothing if it already starts inside it). ``disable_chunked_mm_input``: a
chunk that would end inside an item it starts before is cut before it. A sequence's reference
to an item's output is dropped once its computed tokens pass the item's end, and all of them
when it is preempted or finishes.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from simulator.scheduling.encoder_cache import EncoderCache
from simulator.scheduling.interface import StepPlan
from simulator.scheduling.sequence import Sequence


@mypyc_attr(allow_interpreted_subclasses=True)
class EncoderInputs:
    """The scheduler's encoder budget and cache, planned step by step."""

    def __init__(
        self, max_num_encoder_input_tokens: int, encoder_cache_size: int, no_chunking: bool
    ) -> None:
        if max_num_encoder_input_tokens <= 0:
            raise ValueError(
                "max_num_encoder_input_tokens must be a positive integer, got "
                f"{max_num_encoder_input_tokens!r}"
            )
        self.max_num_encoder_input_tokens = max_num_encoder_input_tokens
        """Placeholder tokens the encoder may compute in one step."""
        self.cache = EncoderCache(encoder_cache_size)
        """The encoder outputs, by content."""
        self.no_chunking = no_chunking
        """``disable_chunked_mm_input``: never cut a chunk inside an item."""
        self.budget = max_num_encoder_input_tokens
        """Encoder tokens left in the step being planned."""
        self.pending: set[Sequence] = set()
        """Sequences with items not yet passed (waiting ones with items included): while any
        is, the fast path declines."""
        # the last ``plan_chunk``'s items and the budget they leave, until ``commit``
        self._items: list[int] = []
        self._duplicates: list[int] = []
        self._seq: Sequence | None = None
        self._step: dict[Sequence, list[int]] = {}  # the items encoded in the step being planned
        self._budget_after = 0

    def rejection_reason(self, seq: Sequence, max_chunk: int) -> str | None:
        """Why ``seq``'s items can never be encoded (an item larger than the encoder cache or
        budget, or, without chunking, than the largest chunk ``max_chunk``), or None."""
        for _, length, _ in seq.mm_items:
            if length > self.cache.cache_size:
                return (
                    f"an item of {length} tokens exceeds encoder_cache_size {self.cache.cache_size}"
                )
            if length > self.max_num_encoder_input_tokens:
                return (
                    f"an item of {length} tokens exceeds max_num_encoder_input_tokens "
                    f"{self.max_num_encoder_input_tokens}"
                )
            if self.no_chunking and length > max_chunk:
                return (
                    f"an item of {length} tokens exceeds the largest chunk ({max_chunk} tokens) "
                    "under disable_chunked_mm_input"
                )
        return None

    def plan_chunk(self, seq: Sequence, computed: int, n: int) -> int:
        """The tokens of ``seq``'s chunk from ``computed`` that can run (``n`` or fewer),
        noting the items to encode for it; ``commit`` takes them if it is scheduled."""
        items: list[int] = []
        duplicates: list[int] = []
        self._items, self._duplicates, self._seq = items, duplicates, seq
        budget, scheduled, end = self.budget, 0, computed + n
        cache, contents = self.cache, set()
        for i, (offset, length, content) in enumerate(seq.mm_items):
            if offset >= end:
                break
            if offset + length <= computed:
                continue
            if self.no_chunking and computed <= offset and computed + n < offset + length:
                n = offset - computed  # even if its output is at hand (vLLM 0.33)
                break
            if content in contents:  # encoded for this sequence in this step already
                duplicates.append(i)
                continue
            if cache.check_and_update(content, seq, i):
                continue
            if not cache.can_allocate(length, budget, scheduled):
                n = min(n, offset - computed) if computed < offset else 0
                break
            scheduled += length
            budget -= length
            contents.add(content)
            items.append(i)
        self._budget_after = budget
        return n

    def commit(self, seq: Sequence) -> None:
        """``seq`` is scheduled with the chunk ``plan_chunk`` sized: encode its items."""
        items = self._items
        if self._seq is not seq or not items:
            return
        self._items, self._seq = [], None
        self.budget = self._budget_after
        mm = seq.mm_items
        for i in items:
            _, length, content = mm[i]
            self.cache.allocate(content, length, seq, i)
        for i in self._duplicates:
            self.cache.check_and_update(mm[i][2], seq, i)
        self._step[seq] = items

    def end_step(self, plan: StepPlan) -> None:
        """After planning: drop the references of the planned sequences to the items their
        chunk passes; note the evictions in the plan."""
        cache, pending = self.cache, self.pending
        for seq, c, n in zip(plan.seqs, plan.context_lens, plan.num_new_tokens, strict=True):
            if not seq.mm_items:
                continue
            done, mm = c + n, seq.mm_items
            for i in cache.held(seq):
                offset, length, content = mm[i]
                if offset + length <= done:
                    cache.release(content, seq, i)
            if done >= seq.mm_end:
                pending.discard(seq)
        plan.encoder_freed = cache.take_freed()
        step = self._step
        if step:
            plan.encoder = step
            plan.encoder_tokens = sum(s.mm_items[i][1] for s, items in step.items() for i in items)
            self._step = {}
        self.budget = self.max_num_encoder_input_tokens  # the next step's, whole

    def drop(self, seq: Sequence, preempted: bool = False) -> None:
        """``seq`` finished, or was preempted (or not admitted): it references no item any
        more (a preempted one has its items ahead again)."""
        for i in self.cache.held(seq):
            self.cache.release(seq.mm_items[i][2], seq, i)
        for i in self._step.pop(seq, ()):  # a victim planned in this step: not encoded after all
            self.budget += seq.mm_items[i][1]  # (its cache room stays taken, as in vLLM)
        if preempted:
            self.pending.add(seq)
        else:
            self.pending.discard(seq)
