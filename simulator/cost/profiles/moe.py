"""The MoE block's profiled time by (tokens on the rank, distinct experts it touches): the
``moe.csv`` of an LLMServingSim bundle, interpolated in two dimensions."""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

from simulator.cost.profiles.csvfile import Kind, read_columns
from simulator.cost.profiles.curve import Curve
from simulator.errors import InputError

_US = 1e-6


class MoeTable:
    """Seconds of one MoE layer on one rank: per profiled token count a curve over the
    activated experts, linear between token counts; beyond the profiled points (either axis)
    extrapolated linearly from the last two, as LLMServingSim's 2D lookup does."""

    __slots__ = ("rows", "tokens", "max_tokens")

    def __init__(self, rows: dict[int, Curve]) -> None:
        if not rows:
            raise ValueError("an MoE table needs at least one token count")
        self.tokens = sorted(rows)
        self.rows = [rows[t] for t in self.tokens]
        self.max_tokens = self.tokens[-1]
        """Largest profiled token count."""

    def at(self, tokens: float, experts: float) -> float:
        """Seconds of one MoE layer for ``tokens`` local tokens touching ``experts`` experts."""
        xs, n = self.tokens, len(self.tokens)
        if n == 1:
            return self.rows[0].at(experts)
        i = bisect_right(xs, tokens)
        i = 1 if i < 1 else (n - 1 if i >= n else i)
        t0, t1 = xs[i - 1], xs[i]
        y0, y1 = self.rows[i - 1].at(experts), self.rows[i].at(experts)
        return y0 + (y1 - y0) * (tokens - t0) / (t1 - t0)


def read_moe(path: Path) -> MoeTable:
    """``tokens, activated_experts, time_us`` rows -> a ``MoeTable``; a repeated point or a
    point with no tokens or no experts -> ``InputError`` naming the line."""
    columns: dict[str, Kind] = {"tokens": "int", "activated_experts": "int", "time_us": "float"}
    cols, lines = read_columns(path, columns)
    points: dict[int, dict[int, tuple[float, int]]] = {}
    rows = zip(cols["tokens"], cols["activated_experts"], cols["time_us"], lines, strict=True)
    for tokens, experts, t, line in rows:
        if tokens < 1 or experts < 1:
            raise InputError(f"{path}:{line}: tokens and activated_experts must be >= 1")
        seen = points.setdefault(tokens, {})
        if experts in seen:
            raise InputError(
                f"{path}:{line}: the point ({tokens}, {experts}) repeats line {seen[experts][1]}"
            )
        seen[experts] = (t * _US, line)
    if not points:
        raise InputError(f"{path}: no rows")
    return MoeTable(
        {tok: Curve(sorted(e), [e[x][0] for x in sorted(e)]) for tok, e in points.items()}
    )
