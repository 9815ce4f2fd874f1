"""A tensor-parallel group larger than one node: refused unless the scenario says how the nodes
connect (``cost_model.network``), and then the part of each all-reduce that crosses nodes
priced over that link (docs/cost_models.md, "TP across nodes").

The all-reduce is taken as NCCL's hierarchical one: each node reduces over its own link
(NVLink, priced as before by each cost model), then every GPU all-reduces its ``1 / g`` slice
of the buffer with its peers of the other ``n`` nodes over its network link (a ring over
``n``: ``2 (n - 1) / n`` of the slice), then the node gathers the result again."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.hardware_spec import HardwareSpec
from simulator.cost.model_spec import ModelSpec
from simulator.errors import DoesNotFit


class NetworkConfig(BaseModel):
    """How the nodes of a TP group that spans nodes connect (one link per GPU, as an HGX
    node's one NIC per GPU)."""

    model_config = ConfigDict(extra="forbid")

    bandwidth: float = Field(gt=0, allow_inf_nan=False)
    """One-way bandwidth of one GPU's link to the other nodes, bytes/s (e.g. 50e9 for a
    400 Gb/s InfiniBand or RoCE NIC per GPU, as on DGX H100)."""
    latency_us: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Latency one all-reduce adds for crossing the nodes, microseconds (0: not known)."""


def nodes_spanned(tp: int, hw: HardwareSpec, network: NetworkConfig | None, where: str) -> int:
    """Nodes a TP group of ``tp`` GPUs of kind ``hw`` spans (1 when the preset does not say
    how many GPUs a node holds); more than 1 without ``network`` -> ``DoesNotFit`` (one line
    naming ``{where}tp``), since the all-reduces would be priced as one NVLink domain."""
    per_node = hw.gpus_per_node
    if per_node is None or tp <= per_node:
        return 1
    nodes = math.ceil(tp / per_node)
    if network is None:
        raise DoesNotFit(
            f"{where}tp: {tp} GPUs span {nodes} nodes of {hw.name} ({per_node} GPUs a node), "
            f"but the scenario does not say how the nodes connect: set {where}network "
            "(bandwidth, latency_us of each GPU's link between nodes) or use tp <= "
            f"{per_node} with more replicas"
        )
    if tp % per_node:
        raise DoesNotFit(
            f"{where}tp: {tp} GPUs over nodes of {per_node} {hw.name}: a TP group spanning "
            f"nodes takes whole nodes (a multiple of {per_node})"
        )
    return nodes


def cross_node_allreduce(
    model: ModelSpec, tp: int, hw: HardwareSpec, network: NetworkConfig | None
) -> tuple[float, float]:
    """``(seconds per step, seconds per token)`` the 2 all-reduces per layer spend crossing
    nodes: ``2 (n - 1) / n`` of each GPU's ``1 / g`` slice of the activations over
    ``network.bandwidth``, plus ``network.latency_us`` each; (0, 0) within one node."""
    nodes = nodes_spanned(tp, hw, network, "cost_model.")
    if nodes == 1 or network is None:
        return 0.0, 0.0
    num = 2 * model.num_layers
    slice_bytes = model.hidden_size * model.dtype_bytes / (tp // nodes)
    per_token = num * 2.0 * (nodes - 1) / nodes * slice_bytes / network.bandwidth
    return num * network.latency_us * 1e-6, per_token
