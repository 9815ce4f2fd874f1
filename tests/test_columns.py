"""A table held as numpy columns (``metrics.Columns``) reads back from its parquet file as the
pandas frame it stands for, categories included, and a run's written tables as its frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.engine.step_sink import ParquetSink
from simulator.metrics import STEP_COLUMNS, Columns
from simulator.results.writer import write_table
from simulator.scenario.runner import run


def table(status: list[str]) -> Columns:
    """Three kinds of column: ints, floats with a NaN, and a categorical status."""
    n = len(status)
    return Columns(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "tpot_s": np.where(np.arange(n) % 2 == 0, 0.5 * np.arange(n), np.nan),
            "status": np.array(status, dtype=object),
        },
        categories={"status": ("finished", "rejected")},
    )


@pytest.mark.parametrize(
    "status", [["finished", "rejected", "finished"], ["finished"] * 4, []], ids=len
)
def test_columns_write_what_pandas_writes_of_their_frame(tmp_path: Path, status: list[str]) -> None:
    """Written through Arrow, the columns read back equal to their frame written by pandas:
    values (NaN kept), dtypes, both categories even when one is unused, and the index (an
    empty table reads back with no category either way)."""
    cols = table(status)
    write_table(cols, tmp_path / "c.parquet")
    cols.frame().to_parquet(tmp_path / "p.parquet", index=False)
    ours, pandas = pd.read_parquet(tmp_path / "c.parquet"), pd.read_parquet(tmp_path / "p.parquet")
    pd.testing.assert_frame_equal(ours, pandas, check_exact=True)
    assert len(ours) == len(status)
    if status:
        assert list(ours["status"].cat.categories) == ["finished", "rejected"]


def test_flags_and_text_columns_are_written_too(tmp_path: Path) -> None:
    """A column that is neither a number nor categorical (flags, text) goes through
    pyarrow's own conversion and reads back as pandas writes it."""
    cols = Columns({"ok": np.array([True, False]), "why": np.array(["a", "b"], dtype=object)})
    write_table(cols, tmp_path / "c.parquet")
    cols.frame().to_parquet(tmp_path / "p.parquet", index=False)
    ours, pandas = pd.read_parquet(tmp_path / "c.parquet"), pd.read_parquet(tmp_path / "p.parquet")
    pd.testing.assert_frame_equal(ours, pandas, check_exact=True)


def test_a_value_outside_the_categories_is_refused() -> None:
    """A status no category names is an error, not a missing value in the file."""
    with pytest.raises(ValueError, match="status"):
        table(["finished", "lost"]).arrow()


def test_a_step_file_with_no_step_has_every_column_as_float64(tmp_path: Path) -> None:
    """A parquet sink closed before any step writes the columns, empty, as float64."""
    sink = ParquetSink(tmp_path / "steps.parquet")
    sink.close()
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert list(steps.columns) == STEP_COLUMNS and len(steps) == 0
    assert (steps.dtypes == np.float64).all()


def test_a_run_holds_its_requests_as_columns_until_read(tmp_path: Path) -> None:
    """A run keeps its request and rejection tables as columns; read as frames they equal the
    written file, a request that can never fit rejected in both."""
    import yaml

    from tests.paths import ROOT

    scenario = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    scenario["workload"]["num_requests"] = 30
    scenario["scheduler"]["num_blocks"] = 40  # 640 tokens of KV: the longest prompts never fit
    result = run(scenario)
    assert isinstance(result.request_table, Columns)
    write_table(result.request_table, tmp_path / "requests.parquet")
    frame = result.requests
    assert (frame["status"] == "rejected").any() and len(result.rejected) > 0
    assert result.rejected.dtypes.to_dict() == {"request_id": np.int64, "reason": object}
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "requests.parquet"), frame)
    assert result.requests is frame  # made once
