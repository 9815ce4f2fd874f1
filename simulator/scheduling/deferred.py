"""The deferred decode group, shared by the policies (docs/scheduler.md, "Fast steps").

Most running sequences of a busy server just decode, step after step. They form a group
(``decode_run.py``) at the head of the running order whose per-sequence work (advancing
``num_computed``, sampling) is deferred to ``_settle()``, which runs before the next
``schedule()`` or whenever the running sequences are read: they are then exactly what
``schedule()`` + ``update()`` would have left after each step. With a prefix cache each step
still takes the blocks of the members entering a new one and caches the blocks they fill, at
once and in the order ``schedule()`` would (evictions included).
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr, trait

from simulator.scheduling.block_hash import extend_hashes
from simulator.scheduling.decode_run import DecodeRun
from simulator.scheduling.interface import DecodeStretch, ManySampler, Sampler, StepPlan
from simulator.scheduling.kv_manager import KVManager
from simulator.scheduling.request_queue import FCFSQueue, PriorityQueue
from simulator.scheduling.sequence import Sequence, SequenceStatus


@trait  # a part of StepScheduler (mypyc: one of its several bases)
@mypyc_attr(allow_interpreted_subclasses=True)
class DeferredDecodes:
    """The deferred decode group of a policy, and its prefix-cache head watch."""

    blocks: KVManager
    waiting: FCFSQueue | PriorityQueue
    max_num_batched_tokens: int
    sample_fn: Sampler | None
    sample_many: ManySampler | None
    eos_token_id: int | None
    _running: list[Sequence]
    _run: DecodeRun | None
    _finishing: list[Sequence]  # members that sample their last token in the step taken
    _fast_plan: StepPlan | None  # the plan of the fast step taken, until it is finished
    _sampled: list[Sequence]  # who sampled in the last update(): a new group starts with them
    # the waiting head's prefix-cache hit as last looked up: (head, hashes its hit could
    # cover or None until needed, hit blocks); kept while no step evicts or caches those
    _memo: tuple[Sequence, frozenset[int] | None, list[int]] | None
    async_scheduling: bool
    fast_path_declined: str | None
    """Why the fast path takes no step of this policy (it overrides a hook the fast path
    cannot honour: ``fast_step.DECLINED_HOOKS``), or None."""

    def _can_defer(self) -> bool:
        """Whether tokens can be sampled later, many at once: no EOS (only sampling reveals
        one), no sampler or one that can give ``k`` tokens at once, and no hook overridden
        that the fast path cannot honour."""
        return (
            self.fast_path_declined is None
            and self.eos_token_id is None
            and (self.sample_fn is None or self.sample_many is not None)
        )

    def _start_run(self) -> DecodeRun:
        """A group of the running sequences, from the head, that sampled in the last update()."""
        bs = self.blocks.block_size
        run = DecodeRun(bs, with_blocks=self.blocks.caching)
        sampled = {id(s) for s in self._sampled}
        running = self._running
        n = 0
        for seq in running:
            if id(seq) not in sampled:
                break
            n += 1
        run.join_all(running[:n], bs)
        self._run = run
        return run

    def _retire(self, seq: Sequence) -> None:
        raise NotImplementedError

    def _settle_async(self) -> None:
        """Implemented by ``fast_async.py``."""
        raise NotImplementedError

    def _async_batch(self) -> list[Sequence]:
        """Implemented by ``fast_async.py``."""
        raise NotImplementedError

    def _async_stretch(self) -> DecodeStretch | None:
        """Implemented by ``fast_async.py``."""
        raise NotImplementedError

    def _take_async(self, n: int, hold_last: bool) -> list[tuple[int, list[Sequence]]]:
        """Implemented by ``fast_async.py``."""
        raise NotImplementedError

    # -- stretches of pure decode steps ------------------------------------------------------

    def decode_stretch(self) -> DecodeStretch | None:
        """The steps ahead in which only the group runs (nobody else runs or waits), while
        its blocks are free; None if the next step is not one (or, with a prefix cache, a
        member has prompt runs: its blocks are hashed step by step). Async: the steps
        after the one in flight (``fast_async.py``)."""
        if self.async_scheduling:
            return self._async_stretch()
        if self._fast_plan is not None:
            self.finish_fast_step()
        blocks = self.blocks
        if self.waiting:
            return None
        run = self._run
        if run is None:
            if not self._can_defer():
                return None
            run = self._start_run()
        m = run.num_seqs
        if not m or m != len(self._running) or m > self.max_num_batched_tokens:
            return None
        bs = blocks.block_size
        if blocks.num_used + run.blocks_to_grow(bs) > blocks.num_blocks:
            return None  # the next step needs a block that is missing
        if not blocks.caching:
            return DecodeStretch(run.segments(blocks.num_used, blocks.num_blocks, bs), 0)
        if run.num_shared:
            return None
        cached = blocks.num_cached_free
        segments = run.segments(blocks.num_used, blocks.num_blocks, bs, cached)
        return DecodeStretch(segments, blocks.num_blocks)

    def take_decodes(self, k: int, hold_last: bool = False) -> list[tuple[int, list[Sequence]]]:
        """Take the first ``k`` steps of the last ``decode_stretch()``; return, for each of
        them in which members finished, (its index in the stretch, who finished). With
        ``hold_last`` the last is only planned: ``finish_fast_step()`` applies it. Async:
        ``k`` steps planned after the one in flight and as many applied (with ``hold_last``
        one fewer: two in flight, ``fast_async.py``)."""
        if self.async_scheduling:
            return self._take_async(k, hold_last)
        run = self._run
        blocks = self.blocks
        assert run is not None and k > 0
        bs, caching = blocks.block_size, blocks.caching
        first = t = run.steps
        out: list[tuple[int, list[Sequence]]] = []
        if hold_last:  # an empty plan of the group's step: its members finish when applied
            self._fast_plan, self._finishing = StepPlan([], [], [], 0, []), []
        while run.num_seqs:
            f = run.next_finish()
            if f > first + k:
                break
            if caching:
                self._take_blocks(run, t, f)
            else:
                blocks.take(run.blocks_over(t, f, bs))
            run.steps = t = f
            done = run.finish_at.pop(f)
            if hold_last and f == first + k:
                self._finishing = done
                break
            for seq in done:
                run.drop(seq, bs)
                self._advance(seq, f - seq.deferred_from)
            for seq in done:
                self._retire(seq)
            out.append((f - first - 1, done))
        if t < first + k:
            if caching:
                self._take_blocks(run, t, first + k)
            else:
                blocks.take(run.blocks_over(t, first + k, bs))
            run.steps = first + k
        return out

    def _take_blocks(self, run: DecodeRun, t: int, u: int) -> None:
        """Give the members the blocks they enter in steps ``t + 1`` .. ``u`` (nobody
        leaving), taken from the pool at once in the order step by step would take them;
        the blocks they fill are counted when they settle (``_advance``)."""
        blocks = self.blocks
        assert run.by_residue is not None
        n = run.blocks_over(t, u, blocks.block_size)
        blocks.grow_group(run.by_residue, run.num_seqs, t, u, n)

    def decode_batch_ids(self) -> list[int]:
        """The ids of the sequences in the deferred decode group, in running order."""
        run = self._run
        if run is None:
            return []
        if self.async_scheduling:
            return [seq.seq_id for seq in self._async_batch()]
        return [seq.seq_id for seq in self._running[: run.num_seqs]]

    def _advance(self, seq: Sequence, k: int) -> None:
        """Apply ``k`` deferred decode steps to member ``seq`` (its blocks were taken already)."""
        if self.sample_fn is not None:
            assert self.sample_many is not None
            seq.output.extend(self.sample_many(seq, k))
        seq.num_computed += k
        seq.num_tokens += k
        seq.deferred_from += k
        # its blocks were taken; those it filled are counted now (hashed if shared)
        self.blocks.settle(seq, seq.num_computed)

    def _settle(self) -> None:
        """Bring every member up to date; the group stays (the offsets do not move; async:
        it ends, ``fast_async.py``)."""
        if self.async_scheduling:
            self._settle_async()
            return
        if self._fast_plan is not None:
            self.finish_fast_step()
        run = self._run
        if run is None or not run.num_seqs:
            return
        steps = run.steps
        for seq in self._running[: run.num_seqs]:
            if seq.deferred_from != steps:
                self._advance(seq, steps - seq.deferred_from)

    def finish_fast_step(self) -> list[Sequence]:
        """Implemented by the fast path (``fast_step.py``)."""
        raise NotImplementedError

    # -- member blocks -------------------------------------------------------------------------

    def _grow_members(self, run: DecodeRun, t: int, grow: int, lag: int = 0) -> None:
        """Take (and with a prefix cache, cache) the members' blocks of step ``t``; the caller
        checked that ``grow`` blocks are free. Only the blocks members with prompt runs fill
        are hashed now (another sequence could hit them); the others are counted when their
        member settles (``_advance``). Async (``lag`` 1): the blocks step ``t - 1`` filled,
        whose last token is known now (a block a prefill filled was cached then)."""
        blocks = self.blocks
        bs = blocks.block_size
        if not blocks.caching:
            blocks.take(grow)
            return
        fills: list[tuple[Sequence, int]] = []
        keyed: list[tuple[Sequence, int, int]] = []
        if run.num_shared:
            u = t - lag
            for seq in run.filling(u, bs):
                j = (seq.num_computed - seq.deferred_from + u) // bs - 1
                if seq.prompt_runs is not None and blocks.num_cached_blocks(seq) <= j:
                    fills.append((seq, j))
            keyed = blocks.fill_hashes(fills)
        if self._memo is not None:
            self._watch_head(grow, [h for _, _, h in keyed])
        if grow:
            blocks.grow_each(run.growing(t, bs), run.num_shared > 0)
        if fills:
            blocks.cache_filled(fills, keyed)

    def _watch_head(self, grow: int, fill_hashes: list[int]) -> None:
        """Forget the head's hit if taking ``grow`` blocks evicts, or the fills cache, a block
        its hit could cover."""
        blocks = self.blocks
        assert self._memo is not None
        head, chain, hits = self._memo
        if head.status is not SequenceStatus.WAITING:
            self._memo = None
            return
        if chain is None:
            bs = blocks.block_size
            hit_max = (head.num_tokens - 1) // bs
            chain = frozenset(extend_hashes(head, hit_max, bs)[:hit_max])
            self._memo = (head, chain, hits)
        if blocks.evicts(grow, chain) or any(h in chain for h in fill_hashes):
            self._memo = None

    def _lookup(self, seq: Sequence) -> list[int]:
        """The prefix-cache hit of waiting ``seq`` (remembered while nothing can change it)."""
        memo = self._memo
        if memo is not None and memo[0] is seq:
            return memo[2]
        hits = self.blocks.lookup(seq)
        self._memo = (seq, None, hits)
        return hits
