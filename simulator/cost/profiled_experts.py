"""The MoE layers of a step on one GPU, priced from a profile's ``moe.csv`` and, under expert
parallelism, the data-parallel ranks' all-gather and reduce-scatter over the link.

As vLLM runs DP + EP (its default ``all2all_backend: allgather_reducescatter``): every MoE
layer gathers the tokens of all DP ranks on every GPU, each GPU computes its ``1/ep`` of the
experts for the (token, expert) pairs routed to them, and the outputs are reduce-scattered
back. So a GPU's expert work follows the step's tokens over *all* ranks, not its own: with
uniform routing it holds ``total x top_k / ep`` pairs, the work ``moe.csv`` measured for
``total / ep`` tokens (each routed to ``top_k`` experts on one GPU), over the distinct local
experts ``total`` tokens touch. Without expert parallelism a rank runs all experts on its own
tokens."""

from __future__ import annotations

from collections.abc import Sequence

from simulator.cost.all_to_all import allgather_reducescatter_time
from simulator.cost.presets import ModelSpec
from simulator.cost.profiles.moe import MoeTable


class ProfiledExperts:
    """All MoE layers of one step on one GPU (``ep`` GPUs share the experts, ``dp`` of them
    data-parallel ranks exchanging tokens over a link of ``(bytes/s, latency us)``)."""

    __slots__ = ("table", "model", "ep", "dp", "link")

    def __init__(
        self,
        table: MoeTable,
        model: ModelSpec,
        ep: int = 1,
        dp: int = 1,
        link: tuple[float, float] | None = None,
    ) -> None:
        self.table, self.model, self.ep, self.dp = table, model, ep, dp
        self.link = link
        """The all-gather's link: (one-way bytes/s per GPU, fixed latency in us); None: free."""

    def time(self, tokens: int) -> float:
        """A step of ``tokens`` tokens on every DP rank alike (the ranks balanced)."""
        return self.across_dp([tokens] * self.dp, 0)

    def across_dp(self, chunks: Sequence[int], rank: int) -> float:
        """Seconds of all MoE layers on DP rank ``rank`` when rank ``i`` runs ``chunks[i]``
        tokens through them (vLLM's padded counts)."""
        if self.ep == 1:  # no expert parallelism: this rank's tokens on all the experts
            own = chunks[rank]
            if own <= 0:
                return 0.0
            experts = self.model.expected_distinct_experts(own)
            return self.model.num_moe_layers * self.table.at(own, experts)
        total = sum(chunks)
        if total <= 0:
            return 0.0
        experts = self.model.expected_distinct_experts(total, self.ep)
        compute = self.table.at(total / self.ep, experts)
        return self.model.num_moe_layers * (compute + self._exchange(chunks))

    def _exchange(self, chunks: Sequence[int]) -> float:
        """One MoE layer's all-gather and reduce-scatter of the ranks' tokens."""
        if self.link is None or len(chunks) == 1:
            return 0.0
        bandwidth, latency = self.link
        m = self.model
        return allgather_reducescatter_time(
            chunks,
            m.hidden_size,
            bandwidth,
            latency,
            top_k=m.num_experts_per_tok or 1,
            bytes_per_element=m.dtype_bytes,
        )
