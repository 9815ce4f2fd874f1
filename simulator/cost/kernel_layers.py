"""The kernels of one model's forward pass on one GPU, looked up in the measured database
(``kernel_db.py``, ``kernel_tables.py``): which GEMM shapes, attention layout, all-reduces and
fused-MoE rows a step runs, and what the database does not time (``configs/kernels/
overheads.yaml``). ``kernels.py`` sums them per step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.cost.kernel_db import KernelDatabase
from simulator.cost.kernel_tables import gemm_curve, message_curve, token_curve
from simulator.cost.kv_heads import kv_heads_per_gpu
from simulator.cost.presets import HardwareSpec, ModelSpec, configs_dir
from simulator.cost.profiles import Curve
from simulator.errors import InputError
from simulator.yaml_file import read_yaml_file

GEMM_DTYPES = {
    None: "bfloat16",
    "bf16": "bfloat16",
    "fp16": "bfloat16",
    "fp8": "fp8",
    "fp4": "nvfp4",
}
"""Our weight dtype -> the GEMM table's ``gemm_dtype`` (fp16 runs at bf16's speed)."""
KV_DTYPES = {None: "bfloat16", "bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}
"""Our KV dtype -> the attention tables' ``kv_cache_dtype``."""


@dataclass(frozen=True)
class Overhead:
    """One operator class the database does not time: ``launch + bytes / rate``."""

    launch: float
    """Seconds per call."""
    rate: float
    """Bytes per second (a learned fraction of the GPU's memory bandwidth)."""

    def times(self, units: np.ndarray, bytes_per_unit: float) -> np.ndarray:
        """Seconds of one call over ``units`` tokens (or sequences); none -> 0."""
        return np.where(units > 0, self.launch + units * bytes_per_unit / self.rate, 0.0)


def _overheads_file() -> dict:
    path = configs_dir() / "kernels" / "overheads.yaml"
    data = read_yaml_file(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of operator classes")
    return data


def load_overheads(hw: HardwareSpec) -> dict[str, Overhead]:
    """The learned operator classes, priced on ``hw``'s memory bandwidth."""
    return {
        op: Overhead(v["launch_us"] * 1e-6, v["bandwidth_fraction"] * hw.hbm_bandwidth)
        for op, v in _overheads_file().items()
        if op not in ("mixed_decode", "launch_gap", "skew")
    }


def launch_gaps() -> dict[str, float]:
    """Seconds per call a database-timed kernel takes more in a forward pass (learned):
    ``gemm``, ``decode_attention``, ``prefill_attention``."""
    return {k: float(v["us"]) * 1e-6 for k, v in _overheads_file()["launch_gap"].items()}


def skew_alpha() -> float:
    """The learned share of the gap between decodes at their longest and at their mean
    context that a batch of mixed lengths takes (``cost_model.skew``)."""
    return float(_overheads_file()["skew"]["alpha"])


def mixed_decode_extra(group: int) -> float:
    """The learned extra fraction of decode attention in a step with a prefill chunk, at
    ``group`` query heads per KV head: linear between the measured group sizes, the
    nearest one beyond them."""
    table = {int(g): float(v["extra"]) for g, v in _overheads_file()["mixed_decode"].items()}
    keys = sorted(table)
    if group <= keys[0] or group >= keys[-1]:
        return table[keys[0] if group <= keys[0] else keys[-1]]
    curve = Curve(keys, [table[k] for k in keys])
    return curve.at(group)


class ModelKernels:
    """The measured kernels of ``model`` on ``tp`` GPUs of ``db``'s GPU (see module doc)."""

    def __init__(self, db: KernelDatabase, model: ModelSpec, tp: int, hbm: float) -> None:
        """Select the tables' rows for this model's shapes and dtypes (``hbm``: the GPU's
        memory bandwidth, bytes/s)."""
        if model.is_mla:
            raise InputError(
                f"cost_model.model: {model.name}: MLA attention is not priced by the kernels "
                "cost model yet; use cost_model.type: physics"
            )
        self.db, self.model, self.tp, self.hbm_bandwidth = db, model, tp, hbm
        gemm = db.read("gemm/gemm_perf", gemm_dtype=GEMM_DTYPES.get(model.weight_dtype, ""))
        assert gemm is not None  # a measured version has its GEMM table
        self._gemm = gemm
        self.where = f"kernel database {db.gpu} vLLM {db.version}"
        if self._gemm.empty:
            raise InputError(
                f"cost_model.weight_dtype: {model.weight_dtype}: no GEMMs measured in {self.where}"
            )
        self.heads = model.num_heads // tp
        self.kv_heads = kv_heads_per_gpu(model, tp)  # one, replicated, past the KV heads
        kv_dtype = KV_DTYPES.get(model.kv_dtype)
        if kv_dtype is None:
            raise InputError(f"cost_model.kv_dtype: {model.kv_dtype}: no attention measured")
        self.kv_dtype: str = kv_dtype

    def gemm(self, n: int, k: int) -> Curve:
        """Seconds of one GEMM of output width ``n`` and depth ``k`` over the tokens."""
        return gemm_curve(self._gemm, n, k, self.where)

    def gemms_per_step(self) -> int:
        """GEMM launches of a step's layers (the LM head apart)."""
        m = self.model
        moe = 1 + (2 if m.num_shared_experts else 0)
        return 2 * m.num_layers + 2 * m.num_dense_layers + moe * m.num_moe_layers

    def token_gemms(self, counts: np.ndarray) -> np.ndarray:
        """Seconds of all layers' GEMMs over ``counts`` tokens (experts apart)."""
        m, tp = self.model, self.tp
        h, d = m.hidden_size, m.head_dim
        q, kv = self.heads * d, self.kv_heads * d
        per_layer = self.gemm(q + 2 * kv, h).table(counts) + self.gemm(h, q).table(counts)
        out = m.num_layers * per_layer
        if m.num_dense_layers:
            width = m.intermediate_size // tp
            up = self.gemm(2 * width if m.gated_mlp else width, h).table(counts)
            out = out + m.num_dense_layers * (up + self.gemm(h, width).table(counts))
        if m.is_moe:
            router = self.gemm(m.num_experts or 1, h).table(counts)
            out = out + m.num_moe_layers * (router + self._shared_experts(counts))
        return np.asarray(out)

    def _shared_experts(self, counts: np.ndarray) -> np.ndarray:
        """One MoE layer's shared experts (a dense MLP beside the routed ones), if any."""
        m = self.model
        width = (m.shared_expert_intermediate_size or 0) * m.num_shared_experts // self.tp
        if not width:
            return np.zeros(len(counts))
        up = self.gemm(2 * width, m.hidden_size).table(counts)
        return np.asarray(up + self.gemm(m.hidden_size, width).table(counts))

    def lm_head(self, seqs: np.ndarray) -> np.ndarray:
        """Seconds of the LM head over ``seqs`` sequences (one row each)."""
        m = self.model
        return np.asarray(self.gemm(-(-m.vocab_size // self.tp), m.hidden_size).table(seqs))

    def allreduce(self) -> Curve | None:
        """Seconds of one TP all-reduce over its bytes: vLLM's custom all-reduce as CUDA
        graphs replay it, else NCCL's; None at ``tp == 1``."""
        if self.tp == 1:
            return None
        rows = self.db.read("comm/custom_allreduce_perf", num_gpus=self.tp, backend="vllm_graph")
        if rows is not None and not rows.empty:
            return message_curve(rows)
        return self.nccl("all_reduce", self.tp)

    def nccl(self, op: str, gpus: int) -> Curve:
        """Seconds of one NCCL collective over its bytes (fp16 rows)."""
        table = self.db.nccl()
        rows = None if table is None else table[(table.op_name == op) & (table.num_gpus == gpus)]
        if rows is None or rows.empty:
            raise InputError(
                f"cost_model.tp: no {op} over {gpus} GPUs measured in {self.where}; "
                "use cost_model.type: physics"
            )
        return message_curve(rows[rows.nccl_dtype == "half"])

    def experts(self, ep: int) -> Curve | None:
        """Seconds of one fused-MoE layer over the tokens entering it (all DP ranks' under
        expert parallelism: the table's ``num_tokens``), balanced routing; None if dense."""
        m = self.model
        if not m.is_moe:
            return None
        dtype = GEMM_DTYPES.get(m.weight_dtype, "")
        tp = 1 if ep > 1 else self.tp
        rows = self.db.read(
            "moe/moe_perf",
            moe_dtype=dtype,
            hidden_size=m.hidden_size,
            inter_size=m.moe_intermediate_size or 0,
            topk=m.num_experts_per_tok or 0,
            num_experts=m.num_experts or 0,
            moe_tp_size=tp,
            moe_ep_size=ep,
            distribution="balanced",
        )
        if rows is not None and not rows.empty:
            return token_curve(rows)
        raise InputError(
            f"cost_model.model: {m.name}: no fused MoE of its shape (hidden {m.hidden_size}, "
            f"{m.num_experts} experts x {m.moe_intermediate_size}, top {m.num_experts_per_tok},"
            f" TP {tp}, EP {ep}, {dtype}) measured in {self.where}; use cost_model.type: physics"
        )
