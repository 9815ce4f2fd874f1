"""What a profile format is read into: per-operator times on one GPU at one TP degree."""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.cost.profiles.attention import AttentionTable
from simulator.cost.profiles.curve import Curve
from simulator.cost.profiles.moe import MoeTable
from simulator.cost.profiles.skew import SkewTable


@dataclass(frozen=True)
class OperatorProfile:
    """Operator times measured on one GPU holding one TP rank's shard (seconds).

    What a profile lacks (attention in Vidur's MLP files, the LM head and sampler, TP
    communication in both formats) the ``profiled`` cost model takes from the roofline."""

    source: str
    """The file or folder it was read from."""
    tp: int
    """Tensor-parallel degree of the shards profiled."""
    per_layer: dict[str, tuple[int, Curve]]
    """Token-parallel operators of one transformer layer: name -> (calls per layer, time by
    the step's token count)."""
    per_step: dict[str, Curve] = field(default_factory=dict)
    """Token-parallel operators run once per step (embedding, final norm), by token count."""
    per_sequence: dict[str, Curve] = field(default_factory=dict)
    """Operators run once per scheduled sequence's last token (LM head, sampler), by the
    number of sequences."""
    attention: AttentionTable | None = None
    """Per-layer attention by (prefill tokens, prefill context, decodes, decode context)."""
    skew: SkewTable | None = None
    """Attention's extra time when decode contexts differ (LLMServingSim's skew fit)."""
    moe: MoeTable | None = None
    """One MoE layer's time on one rank by (local tokens, distinct experts touched); None for
    a dense model's profile."""
    includes_tp_comm: bool = False
    """Whether the times include the all-reduces of tensor parallelism."""
    shape: dict[str, int] = field(default_factory=dict)
    """The model shape the profile names, if it does (checked against the model preset)."""
    provenance: dict[str, str] = field(default_factory=dict)
    """What the profile says about itself (model, GPU, software versions, date)."""

    @property
    def max_tokens(self) -> float:
        """Largest profiled token count of the token-parallel operators."""
        return min(c.hi for _, c in self.per_layer.values())

    @property
    def max_sequences(self) -> float | None:
        """Largest profiled sequence count of the per-sequence operators (None: none)."""
        return min((c.hi for c in self.per_sequence.values()), default=None)
