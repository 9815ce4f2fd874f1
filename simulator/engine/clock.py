"""Sleeping on the simpy clock until an instant, and knowing where the sleep lands: a timeout
of ``t - now`` from ``now`` ends at ``now + (t - now)`` in float, which is not always ``t``;
the fast path must stop exactly there, so whoever sleeps says where."""

from __future__ import annotations

import simpy


def sleep_until(env: simpy.Environment, t: float) -> tuple[float, simpy.Timeout]:
    """A timeout from now to ``t``, and the instant it will end."""
    now = env.now
    return now + (t - now), env.timeout(t - now)
