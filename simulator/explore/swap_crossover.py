"""Where swap preemption beats recompute (docs/swap.md, notebooks/swap_vs_recompute.ipynb).

The setting isolates one preemption: request A (a 16-token prompt, ``A_OUTPUT`` tokens out)
and victim B (``prompt_len`` tokens in, ``B_OUTPUT`` out) arrive together into a KV cache of
exactly their first step's blocks, without prefix caching (else recompute would hit B's own
blocks still cached, as vLLM v1 does). Both prefill in step 1; in step 2 B needs a block and is
preempted with its ``prompt_len`` tokens of KV; it resumes once A finishes, alone. Everything
else being equal, the two runs differ by

- recompute: B's resumption computes its ``prompt_len + 1`` tokens (prompt and first output)
  in one prefill step, where swapped it would decode one token on that context;
- swap: two copies of B's KV blocks (out in step 2, back in on resumption) over the host link.

So the analytic gain of swapping is ``T(prefill of P + 1) - T(decode on P) - 2 x KV bytes /
link bandwidth``, from the cost model alone, and the simulated gain is the difference of the
two runs' durations. The naive recompute cost, the prefill time alone, leaves out that a short
prefill rides on weights the decode would read anyway.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulator.cost import build_cost_model
from simulator.cost.batch import Batch
from simulator.cost.presets import load_model
from simulator.scenario.runner import resolve, run

BLOCK = 16
"""Tokens per KV block (vLLM's default)."""
A_OUTPUT = 17
"""Output tokens of request A: its KV (2 blocks) keeps B out until A finishes."""
B_OUTPUT = 4
"""Output tokens of the victim B."""
BUDGET = 32768
"""``max_num_batched_tokens``: B's recompute is one prefill step up to this prompt length."""


def victim_scenario(
    prompt_len: int, mode: str, link_gb_s: float, folder: Path, *, model: str, hardware: str
) -> dict[str, Any]:
    """The two-request scenario of a victim of ``prompt_len`` tokens (a multiple of
    ``BLOCK``), preempted by ``mode`` over a host link of ``link_gb_s`` GB/s; its trace is
    written in ``folder``."""
    if prompt_len % BLOCK or prompt_len <= 0:
        raise ValueError(f"prompt_len must be a positive multiple of {BLOCK}")
    trace = folder / f"victim-{prompt_len}.csv"
    trace.write_text(
        f"arrival_s,prompt_len,output_len\n0.0,{BLOCK},{A_OUTPUT}\n0.0,{prompt_len},{B_OUTPUT}\n"
    )
    return {
        "name": f"swap-crossover-{mode}-{prompt_len}",
        "scheduler": {
            "policy": "vllm-v1",
            "enable_prefix_caching": False,
            "num_blocks": 1 + prompt_len // BLOCK,
            "block_size": BLOCK,
            "max_num_batched_tokens": BUDGET,
            "max_num_seqs": 2,
            "preemption_mode": mode,
            "host_link_gb_s": link_gb_s,
        },
        "cost_model": {"type": "roofline", "model": model, "hardware": hardware},
        "workload": {"trace": {"path": str(trace), "format": "csv"}},
    }


def simulated_gain(prompt_len: int, link_gb_s: float, *, model: str, hardware: str) -> float:
    """Seconds swapping saves over recomputing the victim (the difference of the two runs'
    durations; negative: recompute is faster)."""
    durations = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("recompute", "swap"):
            cfg = victim_scenario(
                prompt_len, mode, link_gb_s, Path(tmp), model=model, hardware=hardware
            )
            summary = run(cfg).summary
            if summary["num_preemptions"] != 1:  # the setting is broken, not the answer
                raise RuntimeError(f"{mode}: {summary['num_preemptions']} preemptions, not 1")
            durations[mode] = summary["duration_s"]
    return durations["recompute"] - durations["swap"]


def analytic_gains(
    link_gb_s: float, *, model: str, hardware: str
) -> tuple[Callable[[int], float], Callable[[int], float]]:
    """The gain of swapping a victim of ``P`` tokens, from the cost model alone: recompute
    (its prefill in place of a decode) less swap (2 x its KV blocks' bytes / link); and the
    naive one, the prefill time alone less the same copies."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = resolve(
            victim_scenario(BLOCK, "swap", link_gb_s, Path(tmp), model=model, hardware=hardware)
        )
    cost = build_cost_model(cfg.cost_model)
    per_token = load_model(model).kv_bytes_per_token

    def copies(p: int) -> float:
        return 2 * -(-p // BLOCK) * BLOCK * per_token / (link_gb_s * 1e9)

    def gain(p: int) -> float:
        return cost.step_time(Batch([p + 1], [0])) - cost.step_time(Batch([1], [p])) - copies(p)

    def naive(p: int) -> float:
        return cost.step_time(Batch([p], [0])) - copies(p)

    return gain, naive


def crossover(gain: Callable[[int], float], lo: int = BLOCK, hi: int = 16384) -> int | None:
    """The shortest prompt (a multiple of ``BLOCK`` in ``lo..hi``) from which swapping gains
    (``gain`` > 0 there and, by bisection, beyond); ``lo`` if it gains from the start, None
    if it never does up to ``hi``."""
    if gain(lo) > 0:
        return lo
    if gain(hi) <= 0:
        return None
    a, b = lo // BLOCK, hi // BLOCK  # gain(a) <= 0 < gain(b)
    while b - a > 1:
        m = (a + b) // 2
        if gain(m * BLOCK) > 0:
            b = m
        else:
            a = m
    return b * BLOCK
