#!/usr/bin/env python3
"""Ground-truth step traces from vLLM 0.33.0's REAL v1 scheduler for requests with multimodal
encoder inputs (issue 38), on CPU with a fake model.  Kind `mm`: each request carries 0-3 items
(placeholder ranges in its prompt, a content hash that repeats across requests), scheduled by
vLLM's `_try_schedule_encoder_inputs` against `max_num_encoder_input_tokens` and the encoder
cache (`EncoderCacheManager`), drawn per case.

    PY mm.py record --seed 1 --count 300 --prefix mm --out FILE.jsonl.gz
    PY mm.py verify FILE.jsonl.gz [--sample N]

The scheduler is record.py's (one full-attention group, the OPT fake model).  A text model gives
the scheduler no multimodal budget, so the two figures vLLM's MultiModalBudget would derive from
a multimodal model's processor are set on it directly after construction, exactly the two
attributes the scheduling code reads: `max_num_encoder_input_tokens` and
`encoder_cache_manager` (vLLM's EncoderCacheManager.create_manager(cache_size=...)).  MultiModalBudget
makes both at least the largest item's tokens; the generator does the same.
"""
import argparse, json, os, random, sys, time
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record as R  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

MAX_STEPS = 8000
ITEM_TOKEN0 = 45000  # placeholder token of content k: ITEM_TOKEN0 + k (prompt vocab is 1..49999)


def make_scheduler(c):
    s = R.make_scheduler(c)
    s.max_num_encoder_input_tokens = c["max_num_encoder_input_tokens"]
    s.encoder_cache_manager = EncoderCacheManager.create_manager(
        cache_size=c["encoder_cache_size"], vllm_config=s.vllm_config)
    s.scheduler_config.disable_chunked_mm_input = c["disable_chunked_mm_input"]
    return s


def make_request(idx, r, tokens, hasher):
    sp = SamplingParams(ignore_eos=False, max_tokens=r["max_tokens"])
    sp.update_from_generation_config({}, eos_token_id=R.EOS)
    feats = [MultiModalFeatureSpec(data=None, modality="image", identifier=m["hash"],
                                   mm_position=PlaceholderRange(offset=m["offset"],
                                                                length=m["length"]),
                                   mm_hash=m["hash"]) for m in r["mm"]]
    return Request(request_id=r["id"], prompt_token_ids=list(tokens), sampling_params=sp,
                   pooling_params=None, arrival_time=float(idx), priority=r["priority"],
                   block_hasher=hasher, mm_features=feats)


def run_case(case, prompts, collect=None):
    c = case["config"]
    reqs = case["requests"]
    s = make_scheduler(c)
    pool = s.kv_cache_manager.block_pool
    hasher = get_request_block_hasher(c["block_size"], R._HASH_FN)
    vreqs = [make_request(i, r, prompts[i], hasher if c["enable_prefix_caching"] else None)
             for i, r in enumerate(reqs)]
    vhashes = [list(v.block_hashes) if c["enable_prefix_caching"] else hasher(v) for v in vreqs]
    R.check_block_hashes(case, prompts, vhashes)
    arrivals = defaultdict(list)
    for i, r in enumerate(reqs):
        arrivals[r["arrival_step"]].append(i)
    idx = {r["id"]: i for i, r in enumerate(reqs)}
    last = max(arrivals)
    WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
    ecm = s.encoder_cache_manager
    steps = []
    for k in range(MAX_STEPS):
        for i in arrivals.get(k, ()):
            s.add_request(vreqs[i])
        from_waiting = {rid for rid, q in s.requests.items() if q.status in WAITING}
        out = s.schedule()
        ids = list(out.num_scheduled_tokens)
        cached = {}
        for rid in ids:
            if rid in from_waiting:
                n = s.requests[rid].num_computed_tokens - out.num_scheduled_tokens[rid]
                if n:
                    cached[rid] = n
        enc = {rid: list(v) for rid, v in out.scheduled_encoder_inputs.items()}
        enc_tokens = sum(reqs[idx[rid]]["mm"][j]["length"] for rid, v in enc.items() for j in v)
        assert enc_tokens <= c["max_num_encoder_input_tokens"]
        sampled, did = [], []
        for rid in ids:
            q = s.requests[rid]
            if q.num_computed_tokens >= q.num_tokens:
                sampled.append([R.EOS if reqs[idx[rid]]["eos_at"] == q.num_output_tokens
                                else R.OUT_TOKEN0 + idx[rid]])
                did.append(rid)
            else:
                sampled.append([])
        s.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
        finished = [rid for rid in did if rid not in s.requests]
        steps.append({
            "scheduled": [[rid, out.num_scheduled_tokens[rid]] for rid in ids],
            "preempted": sorted(out.preempted_req_ids, key=int),
            "cached": cached,
            "finished": sorted(finished, key=int),
            "free_blocks": pool.get_num_free_blocks(),
            "encoder": enc,
            "encoder_freed": sorted(out.free_encoder_mm_hashes),
            "encoder_free_slots": ecm.num_free_slots,
        })
        if collect is not None:
            collect["encoder_inputs"] += sum(len(v) for v in enc.values())
            collect["encoder_tokens"] += enc_tokens
            collect["preemptions"] += len(out.preempted_req_ids)
            collect["hit_admissions"] += len(cached)
        if k >= last and not s.requests:
            break
    else:
        raise RuntimeError("case did not end within MAX_STEPS")
    if collect is not None:
        collect["steps"] += len(steps)
    return steps


def gen_case(rng, group):
    cfg, reqs, toks = R.gen_case(rng, group, "public")
    bs = cfg["block_size"]
    distinct = rng.randint(1, 6)
    lens = [rng.choice([rng.randint(4, 32), rng.randint(32, 160)]) for _ in range(distinct)]
    ipr = rng.choice([1, 2, 3])
    p_item = rng.choice([0.5, 0.8, 1.0])
    cursor = rng.randrange(distinct)
    for r, t in zip(reqs, toks):
        r["mm"] = []
        n = sum(rng.random() < p_item for _ in range(ipr))
        # item positions: insertion points in the text, in order (an item may follow another)
        points = sorted(rng.randint(0, len(t)) for _ in range(n))
        new, prev = [], 0
        for p in points:
            kcont = cursor % distinct if rng.random() < 0.8 else rng.randrange(distinct)
            cursor += 1
            new.extend(t[prev:p])
            r["mm"].append({"offset": len(new), "length": lens[kcont], "hash": f"img-{kcont}"})
            new.extend([ITEM_TOKEN0 + kcont] * lens[kcont])
            prev = p
        new.extend(t[prev:])
        t[:] = new
        r["prompt_len"] = len(t)
        r["max_tokens"] = max(1, min(r["max_tokens"], R.MAX_MODEL_LEN - len(t)))
        if r["eos_at"] is not None and r["eos_at"] >= r["max_tokens"]:
            r["eos_at"] = None
    for r, h in zip(reqs, R.block_hash_ids(toks, bs)):
        r["block_hashes"] = h
    need = max(-(-(r["prompt_len"] + r["max_tokens"] - 1) // bs) for r in reqs)
    cfg["num_blocks"] = max(cfg["num_blocks"] + sum(lens) // bs, need)
    biggest = max(lens)
    cfg["max_num_encoder_input_tokens"] = rng.choice(
        [biggest, biggest + rng.randint(0, biggest), rng.randint(biggest, 4 * biggest + 64)])
    cfg["encoder_cache_size"] = rng.choice(
        [biggest, biggest + rng.randint(0, biggest), rng.randint(biggest, 2 * sum(lens) + 64)])
    cfg["disable_chunked_mm_input"] = rng.random() < 0.25
    cfg["mm_distinct_items"] = distinct
    return cfg, reqs, toks


def record_one(args):
    seed, prefix, gi, j = args
    group = R.GROUPS[j % len(R.GROUPS)]
    attempt = 0
    while True:
        rng = random.Random(f"mm|public|{seed}|{group}|{j}|{attempt}")
        cfg, reqs, toks = gen_case(rng, group)
        case = {"case": f"{prefix}-{gi:06d}", "vllm": R.VLLM_VERSION, "kind": "mm",
                "group": group, "config": cfg, "requests": reqs}
        st = Counter()
        try:
            case["steps"] = run_case(case, toks, collect=st)
        except RuntimeError:
            attempt += 1
            continue
        st["redrawn"] = attempt
        st["requests"] = len(reqs)
        st["items"] = sum(len(r["mm"]) for r in reqs)
        return gi, json.dumps(case, separators=(",", ":")), dict(st)


def cmd_record(a):
    t0 = time.time()
    agg = Counter()
    tmp = a.out[:-3] + ".part.gz"
    fh = R._open_text(tmp, "w")
    try:
        for n, (gi, line, st) in enumerate(map(record_one, [(a.seed, a.prefix, j, j)
                                                             for j in range(a.count)])):
            fh.write(line + "\n")
            agg.update(st)
            agg["cases"] += 1
            if (n + 1) % 50 == 0:
                print(f"  {n + 1}/{a.count} cases, {time.time() - t0:.0f}s", flush=True)
    finally:
        R._close(fh)
    os.replace(tmp, a.out)
    print(json.dumps(dict(agg), indent=1))
    print(f"wrote {a.out}: {a.count} cases in {time.time() - t0:.0f}s")
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
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--count", type=int, required=True)
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
