"""The autoscaler's metric sources: a replica's gauges averaged by time over a window, and
time-stamped samples (TTFTs) selected by window, both with bounded history."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cluster.gauge import Gauge
from simulator.cluster.timed_samples import TimedSamples


def test_gauge_averages_a_step_signal_by_time() -> None:
    g = Gauge(("running", "waiting"), keep_s=1e9)
    g.record(0.0, 2, 0)
    g.record(10.0, 6, 4)
    g.record(25.0, 0, 0)
    # [5, 30): 5 s at (2, 0), 15 s at (6, 4), 5 s at (0, 0)
    np.testing.assert_allclose(g.average(5.0, 30.0), [(10 + 90) / 25, 60 / 25])
    np.testing.assert_allclose(g.average(12.0, 12.0), [6, 4])  # empty window: the value then
    np.testing.assert_allclose(g.average(100.0, 200.0), [0, 0])  # the last value holds
    assert np.isnan(Gauge(("x",), 10.0).average(0.0, 1.0)).all()


def test_gauge_keeps_only_what_a_window_can_read() -> None:
    g = Gauge(("kv",), keep_s=50.0)
    for t in range(0, 10_000):
        g.record(float(t), float(t % 7))
    assert len(g._times) <= 52  # bounded: ~keep_s of samples, not the whole run
    exact = np.mean([t % 7 for t in range(9950, 9990)])
    assert g.average(9950.0, 9990.0)[0] == pytest.approx(exact)
    g.record(9999.0, 3.0)  # a second record at one instant replaces the first
    assert g.average(9999.0, 10_000.0)[0] == 3.0
    with pytest.raises(ValueError, match="before the last one"):
        g.record(5.0, 1.0)


def test_timed_samples_select_a_half_open_window_and_forget_old_ones() -> None:
    s = TimedSamples(keep_s=100.0)
    for t in np.arange(0.0, 1000.0, 0.5):
        s.add(float(t), float(t) * 2)
    np.testing.assert_array_equal(s.between(950.0, 952.0), [1900.0, 1901.0, 1902.0, 1903.0])
    assert len(s.between(0.0, 800.0)) == 0  # older than keep_s: gone
    assert len(s.between(899.5, 1000.0)) == 201  # 899.5, 900.0, ..., 999.5
    with pytest.raises(ValueError, match="before the last one"):
        s.add(10.0, 1.0)
