"""Deferred decode steps, shared by the policies (docs/scheduler.md, "Deferred decode steps").

Most steps of a busy server decode every running sequence and change nothing else.
``decode_step()`` recognises such a step in O(1) and defers the per-sequence work (advancing
``num_computed``, sampling) to ``_settle()``, which runs before the next ``schedule()`` or
whenever the running sequences are read: they are then exactly what ``schedule()`` +
``update()`` would have left after each of those steps. With a prefix cache a step also takes
the blocks of the sequences entering a new one and caches the blocks it fills, at once, as
``schedule()`` would (evictions included); a step whose evictions or new cached blocks touch
what the head of the waiting queue could hit goes through ``schedule()`` instead.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import islice

from simulator.scheduling.block_hash import extend_hashes
from simulator.scheduling.block_manager import BlockManager
from simulator.scheduling.decode_run import BlockDecodeRun, DecodeRun
from simulator.scheduling.interface import ManySampler
from simulator.scheduling.kv_cache_manager import KVCacheManager
from simulator.scheduling.sequence import Sequence


class DeferredDecodes:
    """The decode fast path of a policy; the policy says who heads its waiting queue and
    whether that head would be admitted after a plain decode step."""

    blocks: BlockManager | KVCacheManager
    max_num_batched_tokens: int
    max_num_seqs: int
    sample_many: ManySampler | None
    eos_token_id: int | None
    _running: list[Sequence]
    _all_decoding: bool
    _run: DecodeRun | None
    _finishing: list[Sequence]

    def _head(self) -> Sequence | None:
        """The waiting sequence admission would try first, if any."""
        raise NotImplementedError

    def _admissible(self, head: Sequence, num_running: int, grow: int, hits: list[int]) -> bool:
        """Whether admission would take ``head`` (starting from ``hits``) after a full decode
        of ``num_running`` sequences that takes ``grow`` more blocks."""
        raise NotImplementedError

    def _retire(self, seq: Sequence) -> None:
        raise NotImplementedError

    def decode_step(self) -> tuple[int, int]:
        """Take the next step as a deferred decode of every running sequence, if the policy
        would plan exactly that (nobody admitted or preempted): return the number of
        sequences and their context tokens before the step; else ``(0, 0)``, and the step
        must go through ``schedule()`` and ``update()``. ``finish_decode_step()`` is then the
        step's ``update()``: it retires the sequences that sampled their last token."""
        if self._finishing:  # the caller skipped finish_decode_step(): do it for them
            self.finish_decode_step()
        run = self._run
        blocks = self.blocks
        bs = blocks.block_size
        if run is None:
            if not self._all_decoding or self.sample_many is None or self.eos_token_id is not None:
                return 0, 0
            kind = BlockDecodeRun if isinstance(blocks, KVCacheManager) else DecodeRun
            run = kind.start(self._running, bs, self.max_num_batched_tokens)
            if run is None:
                return 0, 0
            self._run = run
        if not run.num_seqs:  # everybody finished: the next step admits or the server idles
            return 0, 0
        t = run.steps + 1
        if isinstance(run, BlockDecodeRun):
            if not self._block_step(run, t):
                return 0, 0
        else:
            grow = run.blocks_to_grow(t, bs)
            if blocks.num_used + grow > blocks.num_blocks:  # a block is missing: preemption
                return 0, 0
            head = self._head()
            if head is not None and self._admissible(head, run.num_seqs, grow, []):
                return 0, 0
            assert isinstance(blocks, BlockManager)
            blocks.take(grow)
        run.steps = t
        self._finishing = run.finish_at.pop(t, [])
        return run.num_seqs, run.context + run.num_seqs * (t - 1)

    def _has_room(self, num_running: int) -> bool:
        return num_running < self.max_num_seqs and num_running < self.max_num_batched_tokens

    def _block_step(self, run: BlockDecodeRun, t: int) -> bool:
        """Deferred step ``t`` over blocks with identities: take and cache its blocks, unless
        it is not a plain decode step (then change nothing and return False)."""
        blocks = self.blocks
        assert isinstance(blocks, KVCacheManager)
        pool, bs = blocks.pool, blocks.block_size
        growing, filling = run.growing(t, bs), run.filling(t, bs)
        grow = len(growing)
        if grow > pool.num_free:  # a block is missing: preemption
            return False
        fills = [(seq, (seq.num_computed + t) // bs - 1) for seq in filling]
        fill_hashes = [extend_hashes(seq, j + 1, bs)[j] for seq, j in fills]
        head = self._head()
        if head is not None and self._has_room(run.num_seqs):
            if run.head is not head:
                run.head, run.hits = head, None
                hit_max = (head.num_tokens - 1) // bs
                run.chain = frozenset(extend_hashes(head, hit_max, bs)[:hit_max])
            chain = run.chain
            evicted = islice(pool.free_cached(), max(0, grow - len(pool.free_blank)))
            if any(pool.block_hash[b] in chain for b in evicted):
                return False
            if any(h in chain for h in fill_hashes):
                return False
            if run.hits is None:
                run.hits = blocks.lookup(head)
            if self._admissible(head, run.num_seqs, grow, run.hits):
                return False
        if grow:
            for seq, b in zip(growing, pool.take(grow), strict=True):
                seq.block_ids.append(b)
                seq.num_blocks += 1
        cache = pool.cache
        for (seq, j), h in zip(fills, fill_hashes, strict=True):
            cache(seq.block_ids[j], h)
            seq.num_cached_blocks = j + 1
        return True

    def finish_decode_step(self) -> list[Sequence]:
        """The ``update()`` of a deferred decode step: settle and retire the sequences that
        sampled their last token in it (in plan order); return them."""
        if not self._finishing:
            return []
        done, self._finishing = self._finishing, []
        run = self._run
        assert run is not None
        bs = self.blocks.block_size
        for seq in done:
            run.drop(seq, bs)
            self._advance(seq, run.steps)
            self._retire(seq)
        return done

    def decode_batch_ids(self) -> list[Hashable]:
        """The ids of the sequences the deferred decode steps are stepping, in plan order."""
        return [seq.seq_id for seq in self._running]

    def _advance(self, seq: Sequence, k: int) -> None:
        """Apply ``k`` deferred decode steps to ``seq`` (its blocks were taken already)."""
        assert self.sample_many is not None
        seq.output.extend(self.sample_many(seq, k))
        seq.num_computed += k
        seq.num_tokens += k
        blocks = self.blocks
        if isinstance(blocks, BlockManager):
            blocks.settle(seq, seq.num_computed)

    def _settle(self) -> None:
        """Apply the deferred decode steps to every running sequence."""
        self.finish_decode_step()
        run, self._run = self._run, None
        if run is None or not run.steps:
            return
        for seq in self._running:
            self._advance(seq, run.steps)
