"""A scenario's ``parallel:``: vLLM's data-parallel ranks and expert parallelism on one server."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ParallelConfig(BaseModel):
    """Data-parallel ranks as vLLM runs them (``data_parallel_size``, ``enable_expert_parallel``):
    each rank has its own scheduler and KV cache; requests are spread by vLLM's DP load
    balancer; the ranks of an MoE model step together (a step lasts as long as the slowest
    rank's, an idle rank runs a dummy step)."""

    model_config = ConfigDict(extra="forbid")

    data_parallel_size: int = Field(default=1, ge=1, le=1024)
    """Data-parallel ranks (vLLM's ``data_parallel_size``); 1 is a plain single server (at
    most 1024, each rank a scheduler stepping in lockstep)."""
    enable_expert_parallel: bool = False
    """Split the routed experts over all ``data_parallel_size x tp`` GPUs (vLLM's
    ``enable_expert_parallel``; ``profiled`` and ``roofline`` models, MoE models only): each
    rank holds its share of them (more KV room), each GPU's experts work on every rank's
    tokens, and each MoE layer adds the all-gather and reduce-scatter of those tokens."""
    cuda_graphs: bool = True
    """Pad the ranks' steps as vLLM does with CUDA graphs on (its default; off as with
    ``enforce_eager``): each rank's token count to its CUDA-graph size and, when every rank
    runs a graph, all ranks to the largest (``engine/dp_padding.py``). What the MoE layers of
    a cost model that sees every rank's tokens (``profiled`` under EP) are priced at."""

    @property
    def is_data_parallel(self) -> bool:
        """Whether there is more than one rank."""
        return self.data_parallel_size > 1
