"""A cluster run's tables: the requests and steps of every replica in one table each (with
the replica of each row), the summary with cluster-wide figures, and one row per replica."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from simulator.cluster.replica import Replica
from simulator.engine.recorder import Recorder
from simulator.engine.result import SimulationResult, rejection_table
from simulator.engine.simulation import check_token_count
from simulator.engine.step_sink import StepSink
from simulator.engine.tokens import output_checksums
from simulator.metrics import StepStats, build_requests, summarize
from simulator.workload.workload import Workload

REPLICA_COLUMNS = [
    "replica",
    "group",
    "role",
    "num_blocks",
    "num_requests",
    "num_finished",
    "num_steps",
    "num_tokens",
    "busy_s",
    "utilization",
    "saturated_share",
    "request_throughput",
    "output_token_throughput",
    "kv_utilization_mean",
    "ttft_mean_s",
    "num_preemptions",
]
"""Columns of ``SimulationResult.replicas`` (docs/metrics.md)."""


class ClusterRecords:
    """What a cluster records beside its replicas' recorders: where each request went and,
    disaggregated, its KV transfer."""

    def __init__(
        self,
        workload: Workload,
        disaggregated: bool = False,
        queue_delay_s: float = 0.0,
        response_delay_s: float = 0.0,
    ) -> None:
        n = len(workload)
        self.workload = workload
        self.recorder: Recorder | None = None
        """The first replica's recorder; the others share its per-request records."""
        # typed arrays, not lists: 8 bytes a request and no Python object each (a day of
        # millions of requests), read by index as fast
        self.arrival_s = array("d", np.ascontiguousarray(workload.arrival_s, np.float64).tobytes())
        self.prompt_len = array("q", np.ascontiguousarray(workload.prompt_len, np.int64).tobytes())
        self.output_len = array("q", np.ascontiguousarray(workload.output_len, np.int64).tobytes())
        self.routed_to = array("q", [-1]) * n
        """Per request: the replica it is on (last), -1 if it fit none."""
        m = n if disaggregated else 0  # only a disaggregated cluster hands requests on
        nan = float("nan")
        self.prefill_replica = array("q", [-1]) * m
        self.decode_replica = array("q", [-1]) * m
        self.prefill_preemptions = array("q", [0]) * m
        self.kv_ready = array("d", [nan]) * m
        """Per request: when its prefill ended and its KV transfer was booked."""
        self.kv_start = array("d", [nan]) * m
        """When its transfer got the link."""
        self.kv_end = array("d", [nan]) * m
        """When its transfer ended (ready + wait + bytes / bandwidth + latency)."""
        self.queue_delay_s = queue_delay_s
        """From a request's arrival to its entry in a replica's engine queue (routing, front
        end)."""
        self.response_delay_s = response_delay_s
        """From a sampled token to the client (``serving.response_delay_ms``)."""

    def recorder_for(self, num_blocks: int, sink: StepSink) -> Recorder:
        """A new replica's recorder (sharing the per-request records of the first)."""
        if self.recorder is None:
            self.recorder = Recorder(len(self.workload), num_blocks, sink)
            return self.recorder
        return Recorder(0, num_blocks, sink, shared=self.recorder)

    def reject(self, i: int, reason: str) -> None:
        """Request ``i`` fits no replica."""
        assert self.recorder is not None
        self.recorder.record_rejected(i, reason)

    def handoff(
        self,
        i: int,
        prefill: int,
        decode: int,
        preemptions: int,
        ready: float,
        start: float,
        end: float,
    ) -> None:
        """Request ``i`` left prefill replica ``prefill`` for ``decode``; its KV moves over
        the link from ``start`` to ``end``."""
        self.prefill_replica[i], self.decode_replica[i] = prefill, decode
        self.prefill_preemptions[i] = preemptions
        self.kv_ready[i], self.kv_start[i], self.kv_end[i] = ready, start, end


def _merged_stats(stats: list[StepStats]) -> StepStats:
    """The cluster's step aggregates: counts and KV time summed, the latest end."""
    out = StepStats()
    for s in stats:
        out.merge(s)
    return out


def _steps(replicas: list[Replica]) -> pd.DataFrame | None:
    """Every replica's steps with a ``replica`` column, in order of start (None if kept by
    none: ``steps: none``)."""
    parts = []
    for r in replicas:
        cols = r.server.recorder.close_columns()
        if cols is not None:
            parts.append({**cols, "replica": np.full(len(cols["step"]), r.index, np.int64)})
    if not parts:
        return None
    merged = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    order = np.lexsort((merged["replica"], merged["start_s"]))
    steps = {name: values[order] for name, values in merged.items()}
    steps["step"] = np.arange(len(order), dtype=np.int64)
    return pd.DataFrame(steps, copy=False)


def cluster_result(
    records: ClusterRecords,
    replicas: list[Replica],
    slo: dict[str, float | None] | None,
    percentiles: tuple[float, ...],
    serving_s: np.ndarray | None = None,
) -> SimulationResult:
    """The run's tables and summary (per replica over ``serving_s``: ``replica_table``)."""
    rec, workload = records.recorder, records.workload
    assert rec is not None
    disaggregated = any(r.role == "decode" for r in replicas)
    steps = _steps(replicas)
    recorders = [r.server.recorder for r in replicas]
    rejected = sorted(rec.rejected)
    rejected_ids = [i for i, _ in rejected]
    check_token_count(sum(x.num_tokens for x in recorders), workload.output_len, rejected_ids)
    prefill_preemptions = np.array(records.prefill_preemptions, dtype=np.int64)
    if not disaggregated:  # nothing handed on: none preempted before a handoff
        prefill_preemptions = np.zeros(len(workload), dtype=np.int64)
    requests = build_requests(
        workload,
        queued=np.asarray(workload.arrival_s, dtype=np.float64) + records.queue_delay_s,
        response_delay=records.response_delay_s,
        first_scheduled=np.array(rec.first_scheduled),
        first_token=np.array(rec.first_token),
        finish=np.array(rec.finish),
        num_preemptions=np.array(rec.num_preemptions, dtype=np.int64) + prefill_preemptions,
        num_cached_tokens=np.array(rec.cached_tokens, dtype=np.int64),
        rejected=rejected_ids,
    ).frame()
    replica = np.array(records.routed_to, dtype=np.int64)
    replica[rejected_ids] = -1
    requests["replica"] = replica
    if disaggregated:
        requests["prefill_replica"] = np.array(records.prefill_replica, dtype=np.int64)
        requests["decode_replica"] = np.array(records.decode_replica, dtype=np.int64)
        requests["kv_transfer_s"] = np.array(records.kv_end) - np.array(records.kv_ready)
    stats = _merged_stats([x.step_stats for x in recorders])
    summary = summarize(requests, stats, rec.itl, slo, percentiles, rec.tier_hits)
    table = replica_table(replicas, requests, summary["duration_s"], serving_s)
    summary.update(cluster_summary(table, requests, serving_s))
    return SimulationResult(
        request_table=requests,
        steps=steps,
        summary=summary,
        rejected_table=rejection_table(rejected),
        checksums=output_checksums(np.array(rec.num_output, dtype=np.int64)),
        replicas=table,
    )


def replica_table(
    replicas: list[Replica],
    requests: pd.DataFrame,
    duration: float,
    serving_s: np.ndarray | None = None,
) -> pd.DataFrame:
    """One row per replica: its load, throughput, utilization, KV use and TTFT; the rates and
    shares over the run's ``duration``, or over each replica's own time serving
    (``serving_s[index]``: an autoscaled fleet's replicas come and go)."""
    finished = requests["status"].to_numpy() == "finished"
    where = requests["replica"].to_numpy()
    disaggregated = "decode_replica" in requests
    first_on = requests["prefill_replica"].to_numpy() if disaggregated else where
    to_decode = requests["decode_replica"].to_numpy() if disaggregated else where
    ttft = requests["ttft_s"].to_numpy()
    rows = []
    for r in replicas:
        k, rec = r.index, r.server.recorder
        stats = rec.step_stats
        span = duration if serving_s is None else float(serving_s[k])
        per_s = _per(span)
        # a prefill replica's requests are those it prefilled (they finish on a decode one)
        done = int((finished & ((first_on if r.role == "prefill" else where) == k)).sum())
        mine = ttft[(first_on == k) & finished] if r.role != "decode" else ttft[:0]
        rows.append(
            {
                "replica": k,
                "group": r.group,
                "role": r.role,
                "num_blocks": r.num_blocks,
                "num_requests": int(((to_decode if r.role == "decode" else first_on) == k).sum()),
                "num_finished": done,
                "num_steps": stats.num_steps,
                "num_tokens": stats.num_tokens,
                "busy_s": stats.busy_s,
                "utilization": per_s(stats.busy_s),
                "saturated_share": per_s(stats.saturated_s),
                "request_throughput": per_s(done),
                "output_token_throughput": per_s(rec.num_tokens),
                # as in the run summary: time-weighted over the whole run (or its service)
                "kv_utilization_mean": per_s(stats.kv_time) if span > 0 else 0.0,
                "ttft_mean_s": float(mine.mean()) if mine.size else float("nan"),
                "num_preemptions": stats.num_preemptions,
            }
        )
    return pd.DataFrame(rows, columns=REPLICA_COLUMNS)


def _per(span: float) -> Callable[[float], float]:
    """Per second of ``span`` (NaN for an empty span)."""
    return (lambda x: float(x) / span) if span > 0 else (lambda x: float("nan"))


def _imbalance(work: np.ndarray) -> float:
    """Max over mean (1 = perfectly even; NaN when nobody worked)."""
    mean = work.mean() if work.size else 0.0
    return float(work.max() / mean) if mean > 0 else float("nan")


def cluster_summary(
    table: pd.DataFrame, requests: pd.DataFrame, serving_s: np.ndarray | None = None
) -> dict[str, Any]:
    """Cluster-wide figures beside a run's summary; KV utilization becomes the mean over
    replicas (each time-weighted over the whole run). With ``serving_s`` (an autoscaled
    fleet: ``replica_table``'s), means are weighted by each replica's time serving, and the
    load imbalance compares work per second served."""
    weights = None if serving_s is None else serving_s[table["replica"].to_numpy()]

    def mean(col: str) -> float:
        if weights is None:
            return float(table[col].mean())
        values = table[col].to_numpy(float)
        served = weights > 0
        total = weights[served].sum()
        return float(values[served] @ weights[served] / total) if total > 0 else float("nan")

    out: dict[str, Any] = {
        "num_replicas": len(table),
        "kv_utilization_mean": mean("kv_utilization_mean"),
        "utilization_mean": mean("utilization"),
        "utilization_max": float(table["utilization"].max()),
        "saturated_share": mean("saturated_share"),  # as kv_utilization_mean
        "saturated_share_mean": mean("saturated_share"),
        "saturated_share_max": float(table["saturated_share"].max()),
    }
    roles = list(dict.fromkeys(table["role"]))
    for role in roles:
        key = "load_imbalance" if role == "colocated" else f"{role}_load_imbalance"
        # the work done: with continuous batching a replica is busy whenever it holds a
        # request, so busy time hides how unevenly the work was spread
        mine = (table["role"] == role).to_numpy()
        work = table.loc[mine, "num_tokens"].to_numpy(float)
        if weights is not None:  # a replica that served for less did less
            served = weights[mine] > 0
            work = work[served] / weights[mine][served]
        out[key] = _imbalance(work)
    if "kv_transfer_s" in requests:
        kv = requests["kv_transfer_s"].to_numpy()
        kv = kv[~np.isnan(kv)]
        out["num_kv_transfers"] = int(kv.size)
        out["kv_transfer_mean_s"] = float(kv.mean()) if kv.size else float("nan")
        out["kv_transfer_p99_s"] = float(np.percentile(kv, 99)) if kv.size else float("nan")
    return out
