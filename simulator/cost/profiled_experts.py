"""The MoE layers of a step on one GPU, priced from a profile's ``moe.csv`` and, under expert
parallelism, the data-parallel ranks' all-gather and reduce-scatter over the link.

As vLLM 0.19 runs DP + EP (its default ``all2all_backend: allgather_reducescatter``): every
MoE layer gathers the tokens of all DP ranks on every GPU, and each GPU runs its fused-MoE
kernel over all of them with its ``1/ep`` of the experts: every top-k slot of every gathered
token gets its GEMM blocks, those routed to another GPU's experts writing zeros, and the
activation and the top-k sum run over every slot (vLLM 0.33 drops the remote slots at
alignment instead). So a GPU's expert work follows the step's tokens over *all* ranks, not its
own. Priced as ``moe.csv`` at the local slots (``total x top_k / ep`` of them: the work it
measured for ``total / ep`` tokens, over the distinct local experts ``total`` tokens touch under
uniform routing) plus the remote slots' memory traffic at the HBM rate: per slot its zero tiles
of both GEMMs' outputs, its activation row read and written, its output row read by the top-k
sum (``remote_slot_bytes``). Without expert parallelism a rank runs all experts on its tokens."""

from __future__ import annotations

from collections.abc import Sequence

from simulator.cost.all_to_all import allgather_reducescatter_time
from simulator.cost.presets import ModelSpec
from simulator.cost.profiles.moe import MoeTable


class ProfiledExperts:
    """All MoE layers of one step on one GPU (``ep`` GPUs share the experts, ``dp`` of them
    data-parallel ranks exchanging tokens over a link of ``(bytes/s, latency us)``)."""

    __slots__ = ("table", "model", "ep", "dp", "link", "slot_seconds")

    def __init__(
        self,
        table: MoeTable,
        model: ModelSpec,
        ep: int = 1,
        dp: int = 1,
        link: tuple[float, float] | None = None,
        memory_rate: float | None = None,
    ) -> None:
        self.table, self.model, self.ep, self.dp = table, model, ep, dp
        self.slot_seconds = remote_slot_bytes(model) / memory_rate if memory_rate else 0.0
        """Seconds one remote top-k slot costs a GPU (its traffic at the achieved HBM rate)."""
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
        m = self.model
        experts = m.expected_distinct_experts(total, self.ep)
        local = self.table.at(total / self.ep, experts)
        remote = total * (m.num_experts_per_tok or 1) * (1.0 - 1.0 / self.ep) * self.slot_seconds
        return m.num_moe_layers * (local + remote + self._exchange(chunks))

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


def remote_slot_bytes(model: ModelSpec) -> float:
    """HBM bytes a top-k slot routed to another GPU's expert still moves in vLLM 0.19's
    fused-MoE (``fused_moe_kernel``'s ``write_zeros_to_output`` blocks, the activation and
    ``moe_sum`` over every slot): zeros for the gate-up GEMM's row (``2 x I``) and the down
    GEMM's (``H``), the activation's read of ``2 x I`` and write of ``I``, the sum's read of
    ``H``; at the activations' element size."""
    width = model.moe_intermediate_size or 0
    return model.dtype_bytes * (2 * width + 2 * width + width + 2 * model.hidden_size)
