"""The prefix cache's parts: chained block hashes from token runs (equal hashes exactly when
equal tokens, at any block size), the block pool's eviction order and the KV cache
manager's hits."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.scheduling.block_hash import extend_hashes, output_segment
from simulator.scheduling.block_pool import BlockPool
from simulator.scheduling.kv_manager import KVManager
from simulator.scheduling.sequence import Sequence


def tokens(seq: Sequence, num_outputs: int) -> list[object]:
    """The tokens the runs stand for: segment ``s`` is the stream ``(s, 0), (s, 1), ...``."""
    runs = seq.prompt_runs or (((0, seq.seq_id), seq.prompt_len),)
    out = [(s, k) for s, n in runs for k in range(n)]
    return out + [(output_segment(seq.seq_id), k) for k in range(num_outputs)]


@st.composite
def sequences(draw: st.DrawFn) -> list[Sequence]:
    """Prompts built from a few segments, sharing prefixes, repeating earlier outputs."""
    seqs: list[Sequence] = []
    for i in range(draw(st.integers(2, 6))):
        runs: list[tuple[object, int]] = []
        if seqs and draw(st.booleans()):  # extend an earlier prompt (a next turn)
            base = draw(st.sampled_from(seqs))
            cut = draw(st.integers(1, base.prompt_len))
            for s, n in base.prompt_runs or ():
                if cut <= 0:
                    break
                runs.append((s, min(n, cut)))
                cut -= n
            if draw(st.booleans()):
                runs.append((output_segment(base.seq_id), draw(st.integers(1, 9))))
        for _ in range(draw(st.integers(0 if runs else 1, 3))):
            runs.append((draw(st.integers(0, 3)), draw(st.integers(1, 12))))
        seqs.append(Sequence(i, sum(n for _, n in runs), 30, prompt_runs=tuple(runs)))  # type: ignore[arg-type]
    return seqs


@settings(max_examples=300, deadline=None)
@given(sequences(), st.integers(1, 9), st.integers(0, 20))
def test_equal_block_hashes_exactly_when_equal_tokens(
    seqs: list[Sequence], block_size: int, num_outputs: int
) -> None:
    full = [(s.prompt_len + num_outputs) // block_size for s in seqs]
    hashes = [list(extend_hashes(s, n, block_size)) for s, n in zip(seqs, full, strict=True)]
    toks = [tokens(s, num_outputs) for s in seqs]
    for a in range(len(seqs)):
        for b in range(len(seqs)):
            for j in range(min(full[a], full[b])):
                end = (j + 1) * block_size
                assert (hashes[a][j] == hashes[b][j]) == (toks[a][:end] == toks[b][:end])
    # hashes computed a few blocks at a time are the same as all at once
    for s, n, h in zip(seqs, full, hashes, strict=True):
        s.block_hashes = []
        for k in range(0, n + 1, 2):
            extend_hashes(s, k, block_size)
        assert extend_hashes(s, n, block_size) == h


def test_blank_blocks_go_first_then_least_recently_freed_cached_ones() -> None:
    pool = BlockPool(6)
    a, b = pool.take(3), pool.take(3)
    for j, blk in enumerate(a):
        pool.cache(blk, 100 + j)
    pool.cache(b[0], 200)
    pool.free(list(reversed(a)))  # tail first: a's last block is evicted first
    pool.free(list(reversed(b)))  # b[1], b[2] blank, b[0] cached
    assert pool.num_free == 6 and pool.num_free_cached == 4
    got = pool.take(3)
    assert set(got[:2]) == {b[1], b[2]}  # the blank ones first, though freed last
    assert got[2] == a[2] and pool.lookup(102) is None  # then a's tail, evicted
    assert pool.lookup(100) == a[0] and pool.lookup(200) == b[0]


def test_a_hit_on_a_free_block_takes_it_off_the_free_queue() -> None:
    pool = BlockPool(2)
    (blk,) = pool.take(1)
    pool.cache(blk, 7)
    pool.free([blk])
    assert pool.num_free == 2
    pool.touch([blk])
    assert pool.num_free == 1 and pool.ref_cnt[blk] == 1
    assert pool.take(1) != [blk] and pool.lookup(7) == blk


def test_duplicate_content_serves_the_earliest_and_survives_one_eviction() -> None:
    pool = BlockPool(3)
    x, y = pool.take(2)
    pool.cache(x, 5)
    pool.cache(y, 5)  # vLLM keeps both: a block table never changes under a request
    assert pool.lookup(5) == x
    pool.free([x, y])
    pool.take(2)  # the blank block, then x (the least recently freed) is evicted
    assert pool.lookup(5) == y


def test_hit_stops_before_the_last_token_and_a_preempted_sequence_rehits_its_outputs() -> None:
    kv = KVManager(10, 4, caching=True)
    runs = ((1, 8),)
    a = Sequence(0, 8, 10, prompt_runs=runs)
    assert kv.admit(a, 8, kv.lookup(a))
    b = Sequence(1, 8, 10, prompt_runs=runs)
    assert len(kv.lookup(b)) == 1  # 8 tokens: at most 7 from the cache, in whole blocks
    # a decodes 5 tokens (13 known, 12 computed: 3 full blocks), then is preempted
    a.output, a.num_tokens = [0] * 5, 13
    assert kv.grow(a, 12) and kv.num_cached_blocks(a) == 3
    kv.free(a)
    hits = kv.lookup(a)
    assert len(hits) == 3  # its prompt blocks and the block of its own outputs
    assert kv.num_needed(a, 13, hits) == 4  # 3 free hit blocks + 1 new
    assert kv.lookup(b) == hits[:1]  # b shares the prompt, never a's outputs


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("tcfh"), st.integers(0, 5)), max_size=400))
def test_block_pool_matches_a_plain_ordered_model(ops: list[tuple[str, int]]) -> None:
    """Take, cache, free and hit in any order: free counts, eviction order and the hash map
    are those of a plain list model (the pool skips and compacts stale queue entries)."""
    pool = BlockPool(8)
    held: list[int] = []  # one reference each, in taking order
    blank = set(range(8))
    lru: list[int] = []  # free cached blocks, first evicted first
    content: dict[int, int] = {}  # block -> hash (cached content)
    for op, k in ops:
        if op == "t" and k <= len(blank) + len(lru):
            got = pool.take(k)
            for b in got:
                if b in blank:
                    blank.remove(b)
                else:
                    assert not blank and b == lru.pop(0)  # blank first, then LRU
                    content.pop(b)
            held += got
        elif op == "c" and held:
            b = held[k % len(held)]
            if b not in content:
                pool.cache(b, k)
                content[b] = k
        elif op == "f" and held:
            b = held.pop(k % len(held))
            pool.free([b])
            if b in content and b not in held:
                lru.append(b)
            elif b not in held:
                blank.add(b)
        elif op == "h" and lru:
            b = lru.pop(k % len(lru))
            pool.touch([b])
            held.append(b)
        assert list(pool.free_cached()) == lru
        assert set(pool.free_blank) == blank and pool.num_free == len(blank) + len(lru)
    for _ in range(300):  # many hits on one block leave stale entries: compaction
        if not lru:
            break
        b = lru.pop()
        pool.touch([b])
        pool.free([b])
        lru.append(b)
    assert list(pool.free_cached()) == lru and len(pool.lru) - pool.head <= 2 * len(lru) + 65
