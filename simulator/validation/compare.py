"""Measured vs simulated latencies of the same requests: mean, p50, p90 and p99 of TTFT, TPOT,
ITL (where measured) and E2E, with the signed error of the simulation in percent."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import InputError
from simulator.validation.guidellm_file import read_guidellm
from simulator.validation.measured import MeasuredFormat, MeasuredRun, read_measured

STATS = ("mean", "p50", "p90", "p99")
METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True)
class SimulatedRun:
    """The simulated side, on the measurement's reference (seconds)."""

    source: str
    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    itl: dict[str, float] | None
    """ITL statistics from the run's summary (the gaps themselves are not saved)."""
    prompt_len: np.ndarray
    output_len: np.ndarray
    request_id: np.ndarray
    """Each finished request's number."""


def simulated(
    requests: pd.DataFrame, summary: dict[str, Any], reference: str, source: str
) -> SimulatedRun:
    """The finished requests of a simulation, timed from ``reference``: the client's send
    (``arrival``: the run's ``ttft_s``/``e2e_s``) or the engine's queue (``queued``)."""
    done = requests[requests["status"] == "finished"]
    if reference == "queued":
        start = done["queued_s"] if "queued_s" in done else done["arrival_s"]
        ttft = done["first_token_s"] - start
        e2e = done["finish_s"] - start
    else:
        ttft, e2e = done["ttft_s"], done["e2e_s"]
    raw = {s: summary.get(f"itl_{s}_s") for s in STATS}
    itl = {s: float(v) for s, v in raw.items() if v is not None}
    return SimulatedRun(
        source=source,
        ttft=ttft.to_numpy(dtype=np.float64),
        tpot=done["tpot_s"].to_numpy(dtype=np.float64),
        e2e=e2e.to_numpy(dtype=np.float64),
        itl=itl if len(itl) == len(STATS) else None,
        prompt_len=done["prompt_len"].to_numpy(),
        output_len=done["output_len"].to_numpy(),
        request_id=done["request_id"].to_numpy(),
    )


def read_measured_runs(path: str | Path, fmt: MeasuredFormat) -> list[tuple[str, MeasuredRun]]:
    """``(label, run)`` of every measured run in the file: one, or one per benchmark of a
    guidellm ``benchmarks.json``."""
    if fmt == "guidellm":
        return read_guidellm(path)
    return [(str(path), read_measured(path, fmt))]


def stats(values: np.ndarray) -> dict[str, float]:
    """Mean and percentiles of the defined values (numpy's linear percentiles, as vLLM's
    benchmark)."""
    v = values[~np.isnan(values)]
    if not v.size:
        return dict.fromkeys(STATS, float("nan"))
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def _ids(values: set[int]) -> str:
    """A few request numbers, for a message."""
    shown = sorted(values)
    more = f", ... ({len(shown)} in all)" if len(shown) > 5 else ""
    return "{" + ", ".join(map(str, shown[:5])) + more + "}"


def _id_difference(sim: SimulatedRun, meas: MeasuredRun) -> str | None:
    """Which request ids only one side holds, where the measurement names its requests."""
    if meas.request_id is None:
        return None
    measured, simulated_ = set(meas.request_id.tolist()), set(sim.request_id.tolist())
    if measured == simulated_:
        return None
    return (
        f"measured only {_ids(measured - simulated_)}, simulated only {_ids(simulated_ - measured)}"
    )


def check_same_requests(sim: SimulatedRun, meas: MeasuredRun) -> None:
    """The two sides must hold the same requests: as many, the same ids where the measurement
    names them, with the same lengths (request by request where named, else sorted)."""
    differ = _id_difference(sim, meas)
    if len(sim.ttft) != len(meas):
        raise InputError(
            f"{meas.source}: {len(meas)} requests measured, {len(sim.ttft)} finished in the "
            f"simulation {sim.source}: not the same run" + (f" ({differ})" if differ else "")
        )
    if differ:
        raise InputError(
            f"{meas.source}: request ids differ from the simulation {sim.source}: {differ}: "
            "not the same requests"
        )
    for name, got, want in (
        ("prompt", sim.prompt_len, meas.prompt_len),
        ("output", sim.output_len, meas.output_len),
    ):
        if want is None:
            continue
        if meas.request_id is not None:  # request by request
            a, b = got[np.argsort(sim.request_id)], want[np.argsort(meas.request_id)]
            which = "request {}"
            ids = np.sort(meas.request_id)
        else:
            a, b, which, ids = np.sort(got), np.sort(want), "sorted, #{}", None
        if not np.array_equal(a, b):
            i = int(np.argmax(a != b))
            at = which.format(i if ids is None else int(ids[i]))
            raise InputError(
                f"{meas.source}: {name} lengths differ from the simulation {sim.source} "
                f"({at}: measured {b[i]}, simulated {a[i]}): not the same requests"
            )


def compare(sim: SimulatedRun, meas: MeasuredRun) -> dict[str, dict[str, dict[str, float]]]:
    """``{metric: {stat: {"measured", "simulated", "error_pct"}}}`` in seconds; ITL only when
    measured."""
    check_same_requests(sim, meas)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for metric in METRICS:
        if metric == "itl":
            if meas.itl is None or sim.itl is None:
                continue
            measured, simulated_ = stats(meas.itl), sim.itl
        else:
            measured = stats(getattr(meas, metric))
            simulated_ = stats(getattr(sim, metric))
        out[metric] = {
            s: {
                "measured": measured[s],
                "simulated": simulated_[s],
                "error_pct": _error_pct(simulated_[s], measured[s]),
            }
            for s in STATS
        }
    return out


def _error_pct(simulated_: float, measured: float) -> float:
    if measured == 0 or np.isnan(measured) or np.isnan(simulated_):
        return float("nan")
    return (simulated_ - measured) / measured * 100.0


def format_table(metrics: dict[str, dict[str, dict[str, float]]]) -> str:
    """The comparison as a text table, milliseconds."""
    lines = [f"{'metric':<8}{'stat':<6}{'measured ms':>14}{'simulated ms':>14}{'error':>9}"]
    for metric, by_stat in metrics.items():
        for stat, row in by_stat.items():
            err = row["error_pct"]
            lines.append(
                f"{metric:<8}{stat:<6}{row['measured'] * 1e3:>14.1f}"
                f"{row['simulated'] * 1e3:>14.1f}{'-' if np.isnan(err) else f'{err:+.1f}%':>9}"
            )
    return "\n".join(lines)


def worst_error(metrics: dict[str, dict[str, dict[str, float]]]) -> float:
    """The largest absolute error (percent) over every figure compared."""
    errors = [abs(r["error_pct"]) for m in metrics.values() for r in m.values()]
    return max((e for e in errors if not np.isnan(e)), default=float("nan"))
