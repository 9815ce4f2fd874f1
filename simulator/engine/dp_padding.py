"""How many tokens each data-parallel rank runs in a lockstep step, as vLLM pads them.

vLLM (``GPUModelRunner._determine_batch_execution_and_padding`` and ``coordinate_batch_across_dp``
in vllm/v1/worker/dp_utils.py, 0.19 to 0.33) first pads a rank's step to the smallest CUDA
graph capture size that holds it (a step larger than the largest runs eagerly, unpadded);
then the ranks all-reduce their counts and, when every rank runs a CUDA graph, all of them
pad to the largest count, so that the MoE layers' collectives see equal chunks. An idle rank
runs a one-token dummy decode (``execute_dummy_batch``) and is padded with the rest.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

_DEFAULT_MAX_CAPTURE = 512
"""vLLM's default ceiling on CUDA-graph capture sizes (1,024 on SM 10.x GPUs: not modelled)."""


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """vLLM's default CUDA-graph capture sizes (``VllmConfig._set_cudagraph_sizes``): 1, 2,
    4, every 8 below 256 and every 16 from 256, up to ``min(2 x max_num_seqs, 512,
    max_num_batched_tokens)``, and the token budget itself if it is below that."""
    top = min(2 * max_num_seqs, _DEFAULT_MAX_CAPTURE, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top]
    sizes += list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))
    if max_num_batched_tokens <= top and max_num_batched_tokens not in sizes:
        sizes.append(max_num_batched_tokens)
    return sorted(sizes)


class DPPadding:
    """Pads the ranks' token counts of one step as vLLM does with CUDA graphs on (its
    default); with ``sizes`` None (``enforce_eager``) every rank runs its own count."""

    __slots__ = ("sizes",)

    def __init__(self, sizes: Sequence[int] | None) -> None:
        self.sizes = list(sizes) if sizes else None
        """CUDA-graph capture sizes, ascending; None: no CUDA graphs."""

    def tokens_across_dp(self, tokens: Sequence[int]) -> list[int]:
        """Tokens each rank runs through its layers in a step where rank ``i`` has
        ``tokens[i]`` (an idle rank's dummy step: 1)."""
        sizes = self.sizes
        if sizes is None:
            return list(tokens)
        padded, graphed = [], True
        for n in tokens:
            i = bisect_left(sizes, n)
            if i < len(sizes):
                padded.append(sizes[i])
            else:  # beyond the largest graph: eager, unpadded, and no DP padding this step
                padded.append(n)
                graphed = False
        if graphed:
            return [max(padded)] * len(padded)
        return padded
