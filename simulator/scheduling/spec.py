"""The step scheduler of ``shared/spec/scheduler.md``: continuous batching, chunked prefill,
recompute preemption under a token budget, ``max_num_seqs`` and a KV-block budget.

A plain object with no clock, no randomness and no I/O: the engine calls ``schedule()``, lets
the cost model time the step, then calls ``update()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable

from simulator.scheduling.sequence import Sequence, SequenceStatus

__all__ = ["Scheduler", "Sequence", "SequenceStatus"]


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class Scheduler:
    """vLLM-v1-style step scheduler, exact to the spec."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        sample_fn: Callable[[Sequence], int],
        eos_token_id: int | None = None,
        *,
        sample_many: Callable[[Sequence, int], list[int]] | None = None,
    ) -> None:
        self.num_blocks = _positive("num_blocks", num_blocks)
        self.block_size = _positive("block_size", block_size)
        self.max_num_seqs = _positive("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = _positive("max_num_batched_tokens", max_num_batched_tokens)
        self.sample_fn = sample_fn
        self.eos_token_id = eos_token_id
        self.sample_many = sample_many
        """``sample_many(seq, k)``: the next ``k`` tokens ``sample_fn`` would give, at once;
        enables ``decode_step()`` (with no EOS, which only sampling can reveal)."""
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.finished: list[Sequence] = []
        self.blocks_used = 0
        self.num_preemptions = 0
        self._known: set[Hashable] = set()
        self._scheduled: dict[Hashable, int] = {}
        self.planned: list[Sequence] = []
        """The sequences of the step in flight, in plan order (``update()`` empties it)."""
        self.sampled: list[Sequence] = []
        """Sequences that sampled a token in the last ``update()``, in plan order."""
        self._all_decoding = False  # every running sequence sampled in the last update()
        self._run: _DecodeRun | None = None
        self._finishing: list[Sequence] = []  # retired by finish_decode_step()

    # -- admission -------------------------------------------------------------------------

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens of KV."""
        return -(-num_tokens // self.block_size)

    def can_ever_fit(self, seq: Sequence) -> bool:
        """Whether the sequence's largest KV footprint fits in an empty cache."""
        return self.blocks_for(seq.max_kv_tokens) <= self.num_blocks

    def add(self, seq: Sequence) -> None:
        """Append a new sequence to the tail of ``waiting``."""
        if seq.seq_id in self._known:
            raise ValueError(f"sequence {seq.seq_id!r} was already added")
        if seq.status is not SequenceStatus.WAITING or seq.num_computed or seq.output:
            raise ValueError(f"sequence {seq.seq_id!r} is not new (status {seq.status.value})")
        if not self.can_ever_fit(seq):
            raise ValueError(
                f"sequence {seq.seq_id!r} can never fit: prompt_len {seq.prompt_len} + "
                f"max_tokens {seq.max_tokens} - 1 = {seq.max_kv_tokens} tokens need "
                f"{self.blocks_for(seq.max_kv_tokens)} blocks of {self.block_size}, "
                f"but num_blocks is {self.num_blocks}"
            )
        self._known.add(seq.seq_id)
        self.waiting.append(seq)

    # -- blocks ----------------------------------------------------------------------------

    def _try_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Give ``seq`` the blocks for ``num_tokens`` tokens if they fit; else change nothing."""
        need = -(-num_tokens // self.block_size) - seq.num_blocks
        if need <= 0:
            return True
        if self.blocks_used + need > self.num_blocks:
            return False
        seq.num_blocks += need
        self.blocks_used += need
        return True

    def _free(self, seq: Sequence) -> None:
        self.blocks_used -= seq.num_blocks
        seq.num_blocks = 0

    def _preempt(self, seq: Sequence) -> None:
        """Recompute preemption: drop the KV, keep the output, back to the head of waiting."""
        self.running.remove(seq)
        self._free(seq)
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _make_room(self, seq: Sequence, n: int) -> bool:
        """Grow ``seq`` by ``n`` tokens, preempting from the tail of ``running`` until it fits;
        False if ``seq`` itself had to be preempted."""
        while not self._try_grow(seq, seq.num_computed + n):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    # -- the step --------------------------------------------------------------------------

    def schedule(self) -> dict[Hashable, int]:
        """Plan one step: ``{seq_id: tokens to compute}``, running first, then FCFS admissions."""
        self._settle()
        budget = self.max_num_batched_tokens
        plan: dict[Hashable, int] = {}
        planned: list[Sequence] = []
        running = self.running
        block_size = self.block_size
        # Phase 1: an index loop, because preemption shortens ``running`` under our feet.
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            # The common case, a decode inside its last block, needs no new block: skip the call.
            if seq.num_computed + n > seq.num_blocks * block_size and not self._make_room(seq, n):
                continue  # it preempted itself: running got shorter, so the index stays
            plan[seq.seq_id] = n
            planned.append(seq)
            budget -= n
            i += 1
        # Phase 2: strictly FCFS; a head that does not fit blocks everybody behind it.
        waiting = self.waiting
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            seq = waiting[0]
            n = min(seq.num_tokens - seq.num_computed, budget)
            if not self._try_grow(seq, seq.num_computed + n):
                break
            waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            running.append(seq)
            plan[seq.seq_id] = n
            planned.append(seq)
            budget -= n
        self._scheduled = plan
        self.planned = planned
        return dict(plan)

    def update(self) -> list[Sequence]:
        """Apply the last plan: advance KV, sample completed sequences, retire finished ones."""
        done: list[Sequence] = []
        sampled: list[Sequence] = []
        eos = self.eos_token_id
        sample_fn = self.sample_fn
        # ``planned`` holds the sequences themselves: finishing removes them from ``running``.
        for seq, n in zip(self.planned, self._scheduled.values(), strict=True):
            seq.num_computed += n
            if seq.num_computed == seq.num_tokens:
                tok = sample_fn(seq)
                seq.output.append(tok)
                seq.num_tokens += 1
                sampled.append(seq)
                if tok == eos or len(seq.output) >= seq.max_tokens:
                    done.append(seq)
        for seq in done:
            seq.status = SequenceStatus.FINISHED
            self.running.remove(seq)
            self._free(seq)
            self.finished.append(seq)
        self._scheduled = {}
        self.planned = []
        self.sampled = sampled
        self._all_decoding = len(sampled) - len(done) == len(self.running)
        return done

    # -- decode fast path ------------------------------------------------------------------
    # Most steps of a busy server decode every running sequence and change nothing else.
    # decode_step() recognises such a step in O(1) and defers the per-sequence work (advancing
    # num_computed, sampling) to _settle(), which runs before the next schedule(): the state
    # is then exactly what schedule() + update() would have left after each of those steps.

    def decode_step(self) -> tuple[int, int]:
        """Take the next step as a deferred decode of every running sequence, if the spec
        would plan exactly that (nobody admitted or preempted): return the number of
        sequences and their context tokens before the step; else ``(0, 0)``, and the step
        must go through ``schedule()`` and ``update()``. ``finish_decode_step()`` is then the
        step's ``update()``: it retires the sequences that sampled their last token."""
        if self._finishing:  # the caller skipped finish_decode_step(): do it for them
            self.finish_decode_step()
        run = self._run
        if run is None:
            if not self._all_decoding or self.sample_many is None or self.eos_token_id is not None:
                return 0, 0
            run = _DecodeRun.start(self)
            if run is None:
                return 0, 0
            self._run = run
        if not run.num_seqs:  # everybody finished: the next step admits or the server idles
            return 0, 0
        t = run.steps + 1
        grow = run.crossing[(1 - t) % self.block_size]
        used = self.blocks_used + grow
        if used > self.num_blocks:  # a sequence needs a block that is not free: preemption
            return 0, 0
        if self.waiting and self._admissible(self.waiting[0], run.num_seqs, used):
            return 0, 0
        self.blocks_used = used
        run.steps = t
        self._finishing = run.finish_at.pop(t, [])
        return run.num_seqs, run.context + run.num_seqs * (t - 1)

    def finish_decode_step(self) -> list[Sequence]:
        """The ``update()`` of a deferred decode step: settle and retire the sequences that
        sampled their last token in it (in plan order); return them."""
        if not self._finishing:
            return []
        done, self._finishing = self._finishing, []
        run = self._run
        assert run is not None and self.sample_many is not None
        for seq in done:
            c = seq.num_computed  # still its value when the run started
            seq.output.extend(self.sample_many(seq, run.steps))
            seq.num_computed += run.steps
            seq.num_tokens += run.steps
            self.blocks_used -= self.blocks_for(seq.num_computed)
            seq.num_blocks = 0
            seq.status = SequenceStatus.FINISHED
            self.running.remove(seq)
            self.finished.append(seq)
            run.num_seqs -= 1
            run.context -= c
            run.crossing[c % self.block_size] -= 1
        return done

    def _admissible(self, head: Sequence, num_running: int, used: int) -> bool:
        """Whether phase 2 would admit ``head`` after a full decode of ``num_running``."""
        budget = self.max_num_batched_tokens - num_running
        if budget <= 0 or num_running >= self.max_num_seqs:
            return False
        n = min(head.num_tokens - head.num_computed, budget)
        need = self.blocks_for(head.num_computed + n) - head.num_blocks
        return used + need <= self.num_blocks

    def _settle(self) -> None:
        """Apply the deferred decode steps to every sequence (blocks_used is kept eagerly)."""
        self.finish_decode_step()
        run, self._run = self._run, None
        if run is None or not run.steps:
            return
        k = run.steps
        sample_many = self.sample_many
        assert sample_many is not None
        for seq in self.running:
            seq.output.extend(sample_many(seq, k))
            seq.num_computed += k
            seq.num_tokens += k
            seq.num_blocks = self.blocks_for(seq.num_computed)

    def has_work(self) -> bool:
        """Whether any sequence is waiting or running."""
        return bool(self.waiting or self.running)


class _DecodeRun:
    """The running batch frozen at the start of a stretch of deferred decode steps."""

    __slots__ = ("num_seqs", "context", "finish_at", "crossing", "steps")

    def __init__(
        self,
        num_seqs: int,
        context: int,
        finish_at: dict[int, list[Sequence]],
        crossing: list[int],
    ) -> None:
        self.num_seqs = num_seqs
        self.context = context  # tokens in KV over the batch before the first deferred step
        self.finish_at = finish_at  # [t]: sequences that sample their last token in step t
        self.crossing = crossing  # [r]: sequences whose num_computed % block_size == r
        self.steps = 0

    @classmethod
    def start(cls, sched: Scheduler) -> _DecodeRun | None:
        """Freeze the batch, or None if the next step cannot decode all of it at once."""
        running = sched.running
        if not running or len(running) > sched.max_num_batched_tokens:
            return None
        crossing = [0] * sched.block_size
        context = 0
        finish_at: dict[int, list[Sequence]] = {}
        for seq in running:
            c = seq.num_computed
            context += c
            crossing[c % sched.block_size] += 1
            finish_at.setdefault(seq.max_tokens - len(seq.output), []).append(seq)
        return cls(len(running), context, finish_at, crossing)
