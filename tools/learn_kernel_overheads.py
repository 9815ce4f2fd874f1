"""Learn what the kernel database does not time (norms, rotary, activation, embedding,
sampler) from LLMServingSim's operator profiles, and write configs/kernels/overheads.yaml.

Each operator class is priced ``launch_us + bytes / (bandwidth_fraction x hbm_bandwidth)``: its
bytes per token (or per sequence, the sampler) from the model's shape on one GPU, both constants
fitted by least squares over every bundle that measures it (RTX PRO 6000: Llama-3.1-8B TP1
and TP2, Qwen3-30B-A3B TP1; RTX 4090: Llama-3.1-8B TP1), relative to each GPU's preset
bandwidth so they carry to GPUs nobody profiled. Operator measurements only: no run's
end-to-end latencies enter. Run: python tools/learn_kernel_overheads.py [profiles dir]."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parents[1]
PROFILES = (
    Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "shared/data/llmservingsim/profiles"
)
BANDWIDTH = {"RTXPRO6000": 1.597e12, "RTX4090": 1.008e12}  # the hardware presets' hbm_bandwidth
# per bundle: hidden, heads, kv heads, head_dim, intermediate (dense), vocab
SHAPES = {
    "Llama-3.1-8B": (4096, 32, 8, 128, 14336, 128256),
    "Qwen3-30B-A3B-Instruct-2507": (2048, 32, 4, 128, 6144, 151936),
}
BUNDLES = [
    ("RTXPRO6000", "Llama-3.1-8B", 1),
    ("RTXPRO6000", "Llama-3.1-8B", 2),
    ("RTXPRO6000", "Qwen3-30B-A3B-Instruct-2507", 1),
    ("RTX4090", "Llama-3.1-8B", 1),
]
DTYPE = 2  # bf16 activations in every bundle


def op_bytes(op: str, shape: tuple[int, ...], tp: int) -> float | None:
    """Bytes one token (one sequence, for the sampler) moves through ``op`` on one GPU."""
    h, q, kv, d, inter, vocab = shape
    heads = (q + kv) * d / tp
    return {
        "layernorm": 4 * h * DTYPE,  # fused residual add + RMSNorm: read x, r; write both
        "final_layernorm": 4 * h * DTYPE,
        "embedding": 2 * h * DTYPE,  # gather a row, write it
        "rotary_emb": 2 * heads * DTYPE,  # read and write q and k
        "qk_norm": 2 * heads * DTYPE,
        "act_fn": 3 * inter / tp * DTYPE,  # SiLU-and-mul: read gate and up, write one
        "sampler": vocab * 4 * 4,  # float32 logits: softmax, top-k/p passes (~4 of them)
    }.get(op)


def rows(hw: str, model: str, tp: int):
    """(op, count, time seconds) of one bundle's token and sequence tables."""
    for name in ("dense.csv", "per_sequence.csv"):
        with open(PROFILES / hw / model / f"tp{tp}" / name) as f:
            for r in csv.DictReader(f):
                count = r.get("tokens") or r.get("sequences")
                yield r["layer"], int(count), float(r["time_us"]) * 1e-6


def mixed_penalty() -> dict:
    """Per GQA group size (query heads per KV head): the median extra time of decodes run in
    one attention launch with a prefill chunk (vLLM 0.19's FlashAttention varlen call) over
    the decodes alone, ``(t_mixed - t_chunk - t_decodes) / t_decodes``, from each bundle's
    attention.csv (its mixed points against its pure ones: n_decode >= 32, kv_decode >= 512,
    where the decodes' share is not noise)."""
    import pandas as pd

    by_group: dict[int, list[float]] = {}
    for hw, model, tp in BUNDLES:
        a = pd.read_csv(PROFILES / hw / model / f"tp{tp}" / "attention.csv")
        pre = a[a.n_decode == 0].set_index(["prefill_chunk", "kv_prefill"]).time_us
        dec = a[a.prefill_chunk == 0].set_index(["n_decode", "kv_decode"]).time_us
        mix = a[(a.prefill_chunk > 0) & (a.n_decode >= 32) & (a.kv_decode >= 512)]
        p = pre.reindex(list(zip(mix.prefill_chunk, mix.kv_prefill, strict=True))).to_numpy()
        d = dec.reindex(list(zip(mix.n_decode, mix.kv_decode, strict=True))).to_numpy()
        beta = (mix.time_us.to_numpy() - p - d) / d
        _, q, kv, *_ = SHAPES[model]
        by_group.setdefault(q // kv, []).extend(beta[np.isfinite(beta)].tolist())
    return {
        g: {
            "extra": round(float(np.median(v)), 3),
            "points": len(v),
            "p25": round(float(np.quantile(v, 0.25)), 3),
            "p75": round(float(np.quantile(v, 0.75)), 3),
        }
        for g, v in sorted(by_group.items())
    }


def launch_gaps() -> dict:
    """Microseconds an operator measured on the serving stack (the bundles: eager, one call
    after another) takes beyond the same kernel in the database (its kernel alone), medians
    over the bundles' points on the GPU both measured (RTX PRO 6000): per GEMM (Llama-3.1-8B's
    four projections, TP 1 and 2, up to 512 tokens: the decode and small-chunk steps), per
    decode attention call and per prefill attention call (all their points)."""
    sys.path.insert(0, str(HERE))
    import pandas as pd

    from simulator.cost import KernelsCostConfig, build_cost_model
    from simulator.cost.batch import Batch
    from simulator.cost.kernel_layers import ModelKernels

    gemm: list[float] = []
    for tp in (1, 2):
        cm = build_cost_model(
            KernelsCostConfig(model="llama-3.1-8b", hardware="rtx-pro-6000", tp=tp)
        )
        k = ModelKernels(cm.db, cm.model, tp, cm.hw.hbm_bandwidth)  # type: ignore[attr-defined]
        dense = pd.read_csv(PROFILES / "RTXPRO6000" / "Llama-3.1-8B" / f"tp{tp}" / "dense.csv")
        h, q, kv, d, inter, _ = SHAPES["Llama-3.1-8B"]
        shapes = {
            "qkv_proj": ((q + 2 * kv) * d // tp, h),
            "o_proj": (h, q * d // tp),
            "gate_up_proj": (2 * inter // tp, h),
            "down_proj": (h, inter // tp),
        }
        for op, (n, depth) in shapes.items():
            rows = dense[(dense.layer == op) & (dense.tokens <= 512)]
            curve = k.gemm(n, depth)
            gemm += [t - curve.at(m) * 1e6 for m, t in zip(rows.tokens, rows.time_us, strict=True)]
    cm = build_cost_model(KernelsCostConfig(model="llama-3.1-8b", hardware="rtx-pro-6000"))
    attn = pd.read_csv(PROFILES / "RTXPRO6000" / "Llama-3.1-8B" / "tp1" / "attention.csv")
    rows = cm._attention  # type: ignore[attr-defined]
    layers = cm.model.num_layers  # type: ignore[attr-defined]
    dec = attn[(attn.prefill_chunk == 0) & (attn.n_decode > 0)]
    decode = [
        t - rows.decode(n, c)[0] / layers * 1e6
        for n, c, t in zip(dec.n_decode, dec.kv_decode, dec.time_us, strict=True)
    ]
    pre = attn[(attn.prefill_chunk > 0) & (attn.n_decode == 0) & (attn.kv_prefill == 0)]
    prefill = [
        t - rows.prefill(1, Batch((n,), (0,)).attention_pairs())[0] / layers * 1e6
        for n, t in zip(pre.prefill_chunk, pre.time_us, strict=True)
    ]
    return {
        name: {"us": round(max(0.0, float(np.median(v))), 3), "points": len(v)}
        for name, v in (
            ("gemm", gemm),
            ("decode_attention", decode),
            ("prefill_attention", prefill),
        )
    }


def skew_alpha() -> dict:
    """The median of the bundles' pooled skew-fit alphas (``alpha_default`` per TP in each
    meta.yaml: LLMServingSim's fit of decode batches of mixed lengths against uniform ones)."""
    alphas = []
    for hw, model, _ in BUNDLES:
        meta = yaml.safe_load((PROFILES / hw / model / "meta.yaml").read_text())
        for entry in ((meta.get("skew_fit") or {}).get("per_tp") or {}).values():
            alphas.append(float(entry["alpha_default"]))
    return {"alpha": round(float(np.median(alphas)), 4), "points": len(set(alphas))}


def fit() -> dict:
    """Per operator class: launch_us and efficiency, with the fit's spread."""
    samples: dict[str, list[tuple[float, float]]] = {}
    for hw, model, tp in BUNDLES:
        for op, count, t in rows(hw, model, tp):
            per = op_bytes(op, SHAPES[model], tp)
            if per is not None:
                samples.setdefault(op, []).append((count * per / BANDWIDTH[hw], t))
    out = {}
    for op, pts in sorted(samples.items()):
        x, y = np.array(pts).T
        # relative errors (rows weighted 1/y): small steps matter as much as large ones
        design = np.c_[np.ones_like(x), x] / y[:, None]
        a, c = np.linalg.lstsq(design, np.ones_like(y), rcond=None)[0]
        err = np.abs((a + c * x) / y - 1)
        out[op] = {
            "launch_us": round(float(a) * 1e6, 3),
            "bandwidth_fraction": round(float(1 / c), 4),
            "points": len(pts),
            "median_error": round(float(np.median(err)), 4),
            "p90_error": round(float(np.quantile(err, 0.9)), 4),
        }
    return out


if __name__ == "__main__":
    header = (
        "# What the kernel database does not time, per operator class: launch_us + bytes /\n"
        "# (bandwidth_fraction x hardware.hbm_bandwidth) (a fraction over 1: the data stays in\n"
        "# L2). Fitted by tools/learn_kernel_overheads.py on LLMServingSim's operator profiles\n"
        "# (vLLM 0.19, eager): RTX PRO 6000 Llama-3.1-8B TP1/TP2 and Qwen3-30B-A3B TP1, RTX 4090\n"
        "# Llama-3.1-8B TP1 (servesim fetch llmservingsim; LLMServingSim commit 5daddb2);\n"
        "# median_error / p90_error: the fit's relative error over those points.\n"
    )
    out = HERE / "configs/kernels/overheads.yaml"
    mixed = (
        "# mixed_decode: per GQA group size, the extra fraction of their own attention time that\n"
        "# decodes cost when a prefill chunk shares their attention launch (vLLM 0.19's\n"
        "# FlashAttention varlen call); the kernel database measures pure batches only.\n"
    )
    body = yaml.safe_dump(fit(), sort_keys=False)
    gaps = (
        "# launch_gap: microseconds a kernel the database times takes more on the serving stack,\n"
        "# per call (the bundles' operator times against the database's kernels, RTX PRO 6000;\n"
        "# medians, clipped at 0): the launches and gaps between kernels of a forward pass.\n"
    )
    out.write_text(
        header
        + body
        + mixed
        + yaml.safe_dump({"mixed_decode": mixed_penalty()})
        + gaps
        + yaml.safe_dump({"launch_gap": launch_gaps()}, sort_keys=False)
        + "# skew: decodes of different lengths (cost_model.skew: true): their attention is\n"
        + "# t(mean) + alpha (t(longest) - t(mean)), alpha the median of the bundles' pooled fits.\n"
        + yaml.safe_dump({"skew": skew_alpha()}, sort_keys=False)
    )
    print(out)
