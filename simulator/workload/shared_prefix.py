"""Synthetic prompts that share system prompts, optionally as multi-turn conversations
(``workload.shared_prefix``): the token identity a prefix cache can hit."""

from __future__ import annotations

import numpy as np

from simulator.workload.config import PriorityDraw, SharedPrefixConfig
from simulator.workload.prompt_runs import PromptRuns, output_segment


def shared_prefix_prompts(
    cfg: SharedPrefixConfig, questions: np.ndarray, outputs: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, PromptRuns]:
    """Prompt lengths and runs: request ``i`` belongs to a user drawn uniformly from
    ``num_prefixes * users_per_prefix``; its prompt is its user's system prompt (segment =
    the prefix's index) then its question (segment ``num_prefixes + i``), or, with
    ``multi_turn`` and an earlier request ``j`` of the same user, ``j``'s prompt, ``j``'s
    output, then the question."""
    n = len(questions)
    users = rng.integers(0, cfg.num_prefixes * cfg.users_per_prefix, size=n)
    last: dict[int, int] = {}  # user -> their latest request
    runs: list[list[tuple[int, int]]] = []
    for i, (user, question) in enumerate(zip(users.tolist(), questions.tolist(), strict=True)):
        j = last.get(user) if cfg.multi_turn else None
        if j is None:
            prompt = [(user // cfg.users_per_prefix, cfg.prefix_len)]
        else:
            prompt = [*runs[j], (output_segment(j), int(outputs[j]))]
        prompt.append((cfg.num_prefixes + i, question))
        runs.append(prompt)
        last[user] = i
    lengths = np.fromiter((sum(k for _, k in r) for r in runs), dtype=np.int64, count=n)
    return lengths, PromptRuns.from_lists(runs)


def draw_priorities(cfg: PriorityDraw, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` priorities drawn from ``cfg.values`` with ``cfg.weights``."""
    p = None
    if cfg.weights is not None:
        w = np.asarray(cfg.weights, dtype=np.float64)
        p = w / w.sum()
    return rng.choice(np.asarray(cfg.values, dtype=np.int64), size=n, p=p)
