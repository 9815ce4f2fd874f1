#!/usr/bin/env python3
"""Ground-truth step traces from vLLM 0.33.0's REAL v1 scheduler with a HYBRID KV cache (several
KV-cache groups sharing one block pool, as vLLM's coordinator runs them), on CPU with a fake
model.  Kinds (tools/vllm_recorder/README.md, "Hybrid KV-cache kinds"):

    hybrid_swa    full-attention layers + sliding-window layers (SlidingWindowSpec)
    hybrid_mamba  full-attention layers + Mamba state layers (MambaSpec), vLLM's Mamba block-size
                  rules and its prefix-caching mode ("align") when prefix caching is on

    PY hybrid.py record --kind hybrid_swa --seed 1 --count 300 --prefix swa --out FILE.jsonl.gz
    PY hybrid.py verify FILE.jsonl.gz [--sample N]     # re-run from the file alone, compare

The KV-cache groups are vLLM's own: per-layer specs go through get_global_kv_cache_groups (the
grouping the engine core runs) and the builder's get_kv_cache_config_from_groups, and the block
sizes the scheduler gets come from resolve_kv_cache_block_sizes, as EngineCore does.  The plain
recorder (record.py) supplies the request generator, the fake model and the file handling.
"""
import argparse, json, math, os, random, sys, time
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record as R  # noqa: E402  (imports vllm, sets the CPU environment)
import torch  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.model_executor.models.config import MambaModelConfig  # noqa: E402
from vllm.v1.attention.backends.utils import (  # noqa: E402
    get_supported_kv_cache_layouts, resolve_kv_cache_layout)
from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder  # noqa: E402
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config, get_request_block_hasher, resolve_cache_hit_alignment_tokens,
    resolve_kv_cache_block_sizes)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, MambaSpec, SlidingWindowSpec)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

KINDS = ("hybrid_swa", "hybrid_mamba")
MAX_STEPS = 8000
# the fake attention layer: 1 KV head of 8 fp16 values -> 32 bytes per token (K and V)
KV_HEADS, HEAD_SIZE = 1, 8
ATTN_BYTES_PER_TOKEN = KV_HEADS * 2 * HEAD_SIZE * 2
# the smallest kernel block size of vLLM's default GPU attention backend (FlashAttention:
# MultipleOf(16)); _align_hybrid_block_size aligns hybrid Mamba block sizes to it
KERNEL_BLOCK_ALIGNMENT = 16

# request shapes for the hybrid kinds: longer prompts than the public profile, so that windows
# of 32-512 tokens slide and Mamba chunks cross several blocks
R.PROFILES.setdefault("hybrid", dict(
    nreq=[3, 8, 16, 30], pmax=[64, 200, 600, 1200], omax=[8, 40, 160],
    bs=[16, 32], spread=[0, 5, 15, 40], mns=[1, 2, 4, 8, 16, 32],
    ample_budget=2048, prio=(0, [1, 3, 10])))


# ----------------------------------------------------------------------------------------------
# KV specs and groups, as vLLM builds them

def mamba_attn_block_size(mamba_page_bytes, user_block_size):
    """vLLM's rule (platforms/interface.py _align_hybrid_block_size): the attention block size
    is the smallest multiple of the kernel alignment (max(16, --block-size)) whose attention page
    holds the Mamba state; the Mamba page is then padded to the attention page."""
    align = max(KERNEL_BLOCK_ALIGNMENT, user_block_size)
    bs = align * -(-mamba_page_bytes // (align * ATTN_BYTES_PER_TOKEN))
    return max(bs, user_block_size)


def layer_specs(c):
    """{layer name: KVCacheSpec} for a case's layer list, in model order (`layers` of the config:
    each entry {"type", "count", ...}, interleaved the way the pattern string says)."""
    cc_bs = c["block_size"]
    specs = {}
    for i, t in enumerate(c["layer_pattern"]):
        name = f"model.layers.{i}.attn"
        if t == "F":
            specs[name] = FullAttentionSpec(block_size=cc_bs, num_kv_heads=KV_HEADS,
                                            head_size=HEAD_SIZE, dtype=torch.float16)
        elif t == "S":
            specs[name] = SlidingWindowSpec(block_size=cc_bs, num_kv_heads=KV_HEADS,
                                            head_size=HEAD_SIZE, dtype=torch.float16,
                                            sliding_window=c["sliding_window"])
        elif t == "M":
            m = c["mamba"]
            specs[name] = MambaSpec(shapes=tuple(tuple(s) for s in m["shapes"]),
                                    dtypes=tuple(torch.float16 for _ in m["shapes"]),
                                    block_size=c["mamba_block_size"],
                                    page_size_padded=c["mamba_page_size_padded"],
                                    mamba_cache_mode=c["mamba_cache_mode"],
                                    num_speculative_blocks=0)
        else:
            raise ValueError(t)
    return specs


def make_vllm_config(c):
    mml = c["max_model_len"]
    mc = ModelConfig(model=R._MODEL_DIR, dtype="float16", seed=42, skip_tokenizer_init=True,
                     max_model_len=mml)
    sc = SchedulerConfig(max_num_seqs=c["max_num_seqs"],
                         max_num_batched_tokens=c["max_num_batched_tokens"],
                         max_model_len=mml, enable_chunked_prefill=True, is_encoder_decoder=False,
                         policy=c["policy"], scheduler_reserve_full_isl=c["reserve_full_isl"],
                         long_prefill_token_threshold=c["long_prefill_token_threshold"])
    cc = CacheConfig(block_size=c["block_size"], gpu_memory_utilization=0.9, cache_dtype="auto",
                     enable_prefix_caching=c["enable_prefix_caching"])
    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    return VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc)


def build_kv(c, vc):
    """The scheduler's KVCacheConfig and (scheduler block size, hash block size), following
    EngineCore._initialize_kv_caches with the pool fixed at num_blocks + 1 (the null block)."""
    pool = c["num_blocks"] + 1
    specs = layer_specs(c)
    # the layout the engine core resolves before grouping; vLLM's GPU attention backends
    # (FlashAttention, the Mamba backends) declare no preference: the default order applies
    resolve_kv_cache_layout(vc, [[m.name for m in get_supported_kv_cache_layouts([])]],
                            list(specs.values()))
    groups = get_global_kv_cache_groups(vc, [specs])
    builder = get_kv_cache_config_builder(vc)
    # get_kv_cache_configs minus its start-up memory check (a case's pool may be smaller than
    # one max_model_len request, which vLLM refuses at start-up; scheduling is unaffected)
    kvc = builder.get_kv_cache_config_from_groups(vc, groups, pool)
    assert kvc.num_blocks == pool
    skvc = generate_scheduler_kv_cache_config([kvc])
    vc.cache_config.num_gpu_blocks = pool
    part = [g.kv_cache_spec.block_size for g in skvc.kv_cache_groups
            if g.kv_cache_spec.prefix_cacheable]
    vc.cache_config.block_size = min(part or [g.kv_cache_spec.block_size
                                              for g in skvc.kv_cache_groups])
    sbs, hbs = resolve_kv_cache_block_sizes(skvc, vc)
    align = resolve_cache_hit_alignment_tokens(skvc, vc, sbs, hbs)
    skvc.hash_block_size = hbs
    skvc.cache_hit_alignment_tokens = align
    return skvc, sbs, hbs


def describe_groups(kvc):
    out = []
    for g in kvc.kv_cache_groups:
        s = g.kv_cache_spec
        d = {"type": type(s).__name__, "layers": len(g.layer_names),
             "layer_ids": [int(n.split(".")[2]) for n in g.layer_names],
             "block_size": s.block_size, "page_size_bytes": s.page_size_bytes}
        if isinstance(s, SlidingWindowSpec):
            d["sliding_window"] = s.sliding_window
        if isinstance(s, MambaSpec):
            d["mamba_cache_mode"] = s.mamba_cache_mode
            d["state_bytes"] = s.real_page_size_bytes
        out.append(d)
    return out


def make_scheduler(c):
    vc = make_vllm_config(c)
    if c["kind"] == "hybrid_mamba":
        # what HybridAttentionMambaModelConfig.verify_and_update_config does for a hybrid model:
        # prefix caching on -> mamba_cache_mode "align", mamba_block_size = block_size;
        # off -> "none", mamba_block_size = max_model_len
        MambaModelConfig.verify_and_update_config(vc)
        assert vc.cache_config.mamba_cache_mode == c["mamba_cache_mode"]
        assert vc.cache_config.mamba_block_size == c["mamba_block_size"]
        vc.cache_config.mamba_page_size_padded = c["mamba_page_size_padded"]
    kvc, sbs, hbs = build_kv(c, vc)
    assert describe_groups(kvc) == c["kv_groups"], (describe_groups(kvc), c["kv_groups"])
    assert (sbs, hbs) == (c["scheduler_block_size"], c["hash_block_size"]), (sbs, hbs)
    s = Scheduler(vllm_config=vc, kv_cache_config=kvc, block_size=sbs, hash_block_size=hbs,
                  log_stats=True, structured_output_manager=StructuredOutputManager(vc))
    assert s.kv_cache_manager.enable_caching == c["enable_prefix_caching"]
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == c["num_blocks"]
    assert s.max_num_scheduled_tokens == c["max_num_batched_tokens"]
    assert s.policy.value == c["policy"]
    assert len(s.kv_cache_manager.coordinator.single_type_managers) == len(c["kv_groups"])
    return s


def derive_kv_fields(c):
    """Fill the derived config keys (groups, block sizes) by running vLLM's code."""
    vc = make_vllm_config(c)
    if c["kind"] == "hybrid_mamba":
        MambaModelConfig.verify_and_update_config(vc)
        c["mamba_cache_mode"] = vc.cache_config.mamba_cache_mode
        c["mamba_block_size"] = vc.cache_config.mamba_block_size
        vc.cache_config.mamba_page_size_padded = c["mamba_page_size_padded"]
    kvc, sbs, hbs = build_kv(c, vc)
    c["kv_groups"] = describe_groups(kvc)
    c["scheduler_block_size"] = sbs
    c["hash_block_size"] = hbs


# ----------------------------------------------------------------------------------------------
# the run loop: the plain recorder's, plus the blocks each request holds per group

def held_blocks(s):
    """{request id: [non-null blocks it holds in group 0, 1, ...]} for every request holding
    any; shared (prefix-cached) blocks count for each holder."""
    mgrs = s.kv_cache_manager.coordinator.single_type_managers
    ids = set()
    for m in mgrs:
        ids.update(rid for rid, b in m.req_to_blocks.items() if b)
    return {rid: [sum(1 for b in m.req_to_blocks.get(rid, ()) if not b.is_null) for m in mgrs]
            for rid in sorted(ids, key=int)}


def run_case(case, prompts, collect=None):
    c = case["config"]
    reqs = case["requests"]
    s = make_scheduler(c)
    pool = s.kv_cache_manager.block_pool
    hbs = c["hash_block_size"]
    if c["enable_prefix_caching"]:
        assert hbs == c["block_size"]
    vhasher = get_request_block_hasher(hbs, R._HASH_FN)
    vreqs = [R.make_request(i, r, prompts[i], vhasher if c["enable_prefix_caching"] else None)
             for i, r in enumerate(reqs)]
    rhasher = get_request_block_hasher(c["block_size"], R._HASH_FN)
    vhashes = [list(vr.block_hashes) if c["enable_prefix_caching"] else rhasher(vr)
               for vr in vreqs]
    R.check_block_hashes(case, prompts, vhashes)
    arrivals = defaultdict(list)
    for i, r in enumerate(reqs):
        arrivals[r["arrival_step"]].append(i)
    idx = {r["id"]: i for i, r in enumerate(reqs)}
    eos_at = {r["id"]: r["eos_at"] for r in reqs}
    last = max(arrivals)
    WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
    steps = []
    for k in range(MAX_STEPS):
        for i in arrivals.get(k, ()):
            s.add_request(vreqs[i])
        from_waiting = {rid for rid, q in s.requests.items() if q.status in WAITING}
        for rid in from_waiting:
            assert s.requests[rid].num_computed_tokens == 0
        out = s.schedule()
        ids = list(out.num_scheduled_tokens)
        cached = {}
        for rid in ids:
            if rid in from_waiting:
                n = s.requests[rid].num_computed_tokens - out.num_scheduled_tokens[rid]
                assert n >= 0
                if n:
                    cached[rid] = n
        if not c["enable_prefix_caching"]:
            assert not cached
        blocks = held_blocks(s)  # after schedule(): the step's allocations and window frees
        sampled, did = [], []
        for rid in ids:
            q = s.requests[rid]
            if q.num_computed_tokens >= q.num_tokens:
                sampled.append([R.EOS if eos_at[rid] == q.num_output_tokens
                                else R.OUT_TOKEN0 + idx[rid]])
                did.append(rid)
            else:
                sampled.append([])
        s.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
        finished = [rid for rid in did if rid not in s.requests]
        assert set(finished) == set(s.finished_req_ids)
        steps.append({
            "scheduled": [[rid, out.num_scheduled_tokens[rid]] for rid in ids],
            "preempted": sorted(out.preempted_req_ids, key=int),
            "cached": cached,
            "finished": sorted(finished, key=int),
            "free_blocks": pool.get_num_free_blocks(),
            "blocks": blocks,
        })
        if collect is not None:
            collect["preemptions"] += len(out.preempted_req_ids)
            collect["hit_admissions"] += len(cached)
            collect["hit_tokens"] += sum(cached.values())
        if k >= last and not s.requests:
            break
    else:
        raise RuntimeError("case did not end within MAX_STEPS")
    if collect is not None:
        collect["steps"] += len(steps)
    return steps


# ----------------------------------------------------------------------------------------------
# case generation

def _pattern(rng, kind):
    """Layer pattern (model order): F = full attention, S = sliding window, M = Mamba.  Ratios of
    the models served in 2026: gpt-oss 1:1, Gemma 3/4 5:1 local:global, Qwen3.5 3:1 linear:full,
    Nemotron-H ~ 7:1 Mamba:attention; a few layers each (the grouping depends on the counts)."""
    other = "S" if kind == "hybrid_swa" else "M"
    ratio = rng.choice([1, 2, 3, 5, 7])
    n_full = rng.choice([1, 2, 3])
    unit = [other] * ratio + ["F"]
    pat = unit * n_full
    if rng.random() < 0.2:  # an uneven pattern: vLLM pads the groups
        pat = pat + [other] * rng.randint(1, ratio)
    return "".join(pat)


def gen_case(rng, kind, group):
    cfg, reqs, toks = R.gen_case(rng, group, "hybrid")
    bs = cfg["block_size"]
    cfg["layer_pattern"] = _pattern(rng, kind)
    if kind == "hybrid_swa":
        cfg["sliding_window"] = rng.choice([32, 48, 64, 100, 128, 256, 512, rng.randint(32, 512)])
    else:
        # a Mamba state small enough for the attention page of the drawn block size under
        # vLLM's rule (mamba_attn_block_size), padded to it
        lo = 0 if bs == KERNEL_BLOCK_ALIGNMENT else (bs - KERNEL_BLOCK_ALIGNMENT) * ATTN_BYTES_PER_TOKEN
        hi = bs * ATTN_BYTES_PER_TOKEN
        state = rng.randint(lo // 2 + 1, hi // 2) * 2  # fp16 elements -> even bytes
        conv = rng.randint(1, max(1, state // 2 // 4)) * 2
        ssm = state - conv
        cfg["mamba"] = {"shapes": [[conv // 2], [ssm // 2]], "dtype": "float16"}
        assert mamba_attn_block_size(state, bs) == bs, (state, bs)
        cfg["mamba_page_size_padded"] = bs * ATTN_BYTES_PER_TOKEN
        # sizes only: the derive step fills mamba_cache_mode / mamba_block_size from vLLM
        cfg["mamba_cache_mode"] = cfg["mamba_block_size"] = None
    cfg["kind"] = kind
    derive_kv_fields(cfg)
    # every request must fit alone: the pool holds at least one request's blocks in every group
    need = 0
    for r in reqs:
        n = 0
        for g in cfg["kv_groups"]:
            if g["type"] == "MambaSpec":
                n += 1 if g["mamba_cache_mode"] == "none" else 2
            elif g["type"] == "SlidingWindowSpec":
                w = g["sliding_window"]
                n += min(-(-(r["prompt_len"] + r["max_tokens"]) // bs),
                         -(-(w - 1 + cfg["max_num_batched_tokens"]) // bs) + 1)
            else:
                n += -(-(r["prompt_len"] + r["max_tokens"]) // bs)
        need = max(need, n)
    ngroups = len(cfg["kv_groups"])
    cfg["num_blocks"] = max(cfg["num_blocks"] * ngroups // 2, need + rng.randint(0, 2 * ngroups))
    return cfg, reqs, toks


def record_one(args):
    kind, seed, prefix, gi, j = args
    group = R.GROUPS[j % len(R.GROUPS)]
    attempt = 0
    while True:
        rng = random.Random(f"{kind}|hybrid|{seed}|{group}|{j}|{attempt}")
        cfg, reqs, toks = gen_case(rng, kind, group)
        case = {"case": f"{prefix}-{gi:06d}", "vllm": R.VLLM_VERSION, "kind": kind,
                "group": group, "config": cfg, "requests": reqs}
        st = Counter()
        try:
            case["steps"] = run_case(case, toks, collect=st)
        except RuntimeError:
            attempt += 1
            continue
        st["redrawn"] = attempt
        st["cases_with_preemption"] = int(st["preemptions"] > 0)
        st["cases_with_hits"] = int(st["hit_tokens"] > 0)
        st["requests"] = len(reqs)
        st["kv_groups"] = len(cfg["kv_groups"])
        st["prefix_caching"] = int(cfg["enable_prefix_caching"])
        return gi, kind, json.dumps(case, separators=(",", ":")), dict(st)


def cmd_record(a):
    jobs = []
    for kind in a.kind.split(","):
        assert kind in KINDS, kind
        jobs += [(kind, a.seed, a.prefix, len(jobs) + j, j) for j in range(a.count)]
    t0 = time.time()
    agg = defaultdict(Counter)
    tmp = a.out[:-3] + ".part.gz"
    fh = R._open_text(tmp, "w")
    try:
        for n, (gi, g, line, st) in enumerate(map(record_one, jobs)):
            fh.write(line + "\n")
            agg[g].update(st)
            agg[g]["cases"] += 1
            if (n + 1) % 50 == 0:
                print(f"  {n + 1}/{len(jobs)} cases, {time.time() - t0:.0f}s", flush=True)
    finally:
        R._close(fh)
    os.replace(tmp, a.out)
    summary = {g: dict(c) for g, c in sorted(agg.items())}
    print(json.dumps(summary, indent=1))
    print(f"wrote {a.out}: {len(jobs)} cases in {time.time() - t0:.0f}s")
    return 0


def cmd_verify(a):
    with R._open_text(a.file, "r") as fh:
        lines = fh.readlines()
    rng = random.Random(a.seed)
    pick = sorted(rng.sample(range(len(lines)), min(a.sample, len(lines))))
    bad, nsteps, t0 = [], 0, time.time()
    for i in pick:
        case = json.loads(lines[i])
        steps = run_case(case, R.prompts_from_case(case))
        nsteps += len(steps)
        if steps != case["steps"]:
            bad.append(case["case"])
    print(f"verify {a.file}: {len(pick)} cases, {nsteps} steps re-run through vLLM "
          f"{R.VLLM_VERSION}: {len(pick) - len(bad)} identical, {len(bad)} different "
          f"{bad[:10]} ({time.time() - t0:.0f}s)")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--kind", required=True, help="comma list of " + ", ".join(KINDS))
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--count", type=int, required=True, help="cases per kind")
    r.add_argument("--prefix", required=True)
    r.add_argument("--out", required=True)
    v = sub.add_parser("verify")
    v.add_argument("file")
    v.add_argument("--sample", type=int, default=100)
    v.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    return {"record": cmd_record, "verify": cmd_verify}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
