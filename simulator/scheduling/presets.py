"""The built-in scheduling policies as flags of ``StepScheduler`` (docs/scheduler.md)."""

from __future__ import annotations

PRESETS: dict[str, dict[str, bool]] = {
    "spec": {},
    "vllm-v1": {
        "admit_after_preemption": False,
        "reserve_full_isl": True,
        "enable_prefix_caching": True,
    },
}
"""The built-in policies as flags of ``StepScheduler`` (the constructor's defaults are
``spec``'s); docs/scheduler.md."""
