"""The vision encoder's attention, measured: aiconfigurator-core's ``encoder_attention`` table
(vLLM 0.24's ViT flash attention, ``vllm_vit_flash_attn_fa3`` on Hopper; milliseconds per
layer for ``batch_size`` sequences of ``isl`` patches at ``num_heads`` x ``head_dim``), read in
place (``kernel_db.py``). Used by the ``kernels`` and ``physics`` cost models when the GPU and
the encoder's heads are measured; elsewhere the attention is priced by its FLOPs
(``vision_encoder.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simulator.cost.hardware_spec import HardwareSpec
from simulator.cost.kernel_db import KernelDatabase
from simulator.errors import InputError

if TYPE_CHECKING:  # scipy is imported by a run that prices images, not by every run
    from scipy.interpolate import PchipInterpolator

TABLE = "encoder_attention/encoder_attention_perf"
"""The table, as ``family/name`` under a GPU's folder."""


@dataclass(frozen=True)
class MeasuredEncoderAttention:
    """One ViT layer's attention time over an image's patches, from measured points."""

    curve: PchipInterpolator
    """log(latency ms) against log(patches), monotone between the measured points."""
    largest: int
    """The most patches measured: beyond, the time grows as the square of the patches."""
    source: str
    """The table's file."""

    @classmethod
    def load(
        cls, hardware: HardwareSpec, heads: int, head_dim: int
    ) -> MeasuredEncoderAttention | None:
        """The GPU's measured points for one image (batch 1) at ``heads`` x ``head_dim``, or
        None if the database (or this GPU, or these heads) is not there."""
        try:
            db = KernelDatabase.open(hardware.kernels_gpu, None, hardware.name)
            path = db.path(TABLE)
            rows = db.read(TABLE, batch_size=1, num_heads=heads, head_dim=head_dim)
        except InputError:  # not installed, or the GPU not measured
            return None
        if rows is None or path is None or len(rows) < 2:
            return None
        from scipy.interpolate import PchipInterpolator

        points = rows.groupby("isl")["latency"].median().sort_index()
        isl = points.index.to_numpy(dtype=np.float64)
        curve = PchipInterpolator(np.log(isl), np.log(points.to_numpy(dtype=np.float64)))
        return cls(curve, int(isl[-1]), str(path))

    def seconds(self, patches: int) -> float:
        """One layer's attention over ``patches`` patches."""
        p = max(patches, 1)
        if p > self.largest:  # quadratic beyond the table
            return float(np.exp(self.curve(np.log(self.largest)))) * (p / self.largest) ** 2 * 1e-3
        return float(np.exp(self.curve(np.log(p)))) * 1e-3
