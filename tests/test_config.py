"""Scenario validation errors: one line that points at what the user has to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.errors import InputError
from simulator.scenario.config import load_scenario
from tests.paths import ROOT

QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_misspelt_required_key_is_reported_with_a_suggestion(tmp_path: Path) -> None:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["scheduler"]["max_num_seq"] = data["scheduler"].pop("max_num_seqs")
    with pytest.raises(InputError) as err:
        load_scenario(_write(tmp_path, data))
    msg = str(err.value)
    # the misspelling, not the "missing" key it causes, comes first
    assert "scheduler.max_num_seq: Extra inputs are not permitted" in msg
    assert "did you mean max_num_seqs?" in msg
    assert "\n" not in msg


def test_misspelt_nested_key_in_a_tagged_union(tmp_path: Path) -> None:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["workload"]["prompt_len"]["muu"] = data["workload"]["prompt_len"].pop("mu")
    with pytest.raises(InputError, match=r"workload\.prompt_len\.muu: .*did you mean mu\?"):
        load_scenario(_write(tmp_path, data))


def test_unknown_key_without_a_close_match_gets_no_suggestion(tmp_path: Path) -> None:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["scheduler"]["frobnicate"] = 1
    with pytest.raises(InputError) as err:
        load_scenario(_write(tmp_path, data))
    assert "scheduler.frobnicate: Extra inputs are not permitted" in str(err.value)
    assert "did you mean" not in str(err.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cost_model.tp=3", "cost_model.tp: 3 does not divide num_heads=32"),
        ("cost_model.model=llama-9", "cost_model.model: unknown model preset 'llama-9'"),
        (
            "workload.prompt_len={dist: empirical, path: nope.csv, column: x}",
            "workload.prompt_len.path: nope.csv: file not found",
        ),
    ],
)
def test_validate_catches_what_run_would_fail_on(
    override: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator.cli import main

    assert main(["validate", str(QUICKSTART), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_validate_reads_the_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.cli import main

    replay = ROOT / "scenarios" / "azure-code-replay.yaml"
    missing = str(tmp_path / "absent.csv")
    assert main(["validate", str(replay), "--set", f"workload.trace.path={missing}"]) == 2
    err = capsys.readouterr().err
    assert "workload.trace.path:" in err and "servesim fetch traces" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nnot-a-time,1,1\n")
    assert main(["validate", str(replay), "--set", f"workload.trace.path={bad}"]) == 2
    assert "bad.csv:2" in capsys.readouterr().err


def test_a_derived_kv_budget_names_the_preset_key(capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.cli import main

    # chunked-prefill-budgets derives num_blocks from the roofline's model and GPU
    scenario = str(ROOT / "scenarios" / "chunked-prefill-budgets.yaml")
    assert main(["validate", scenario, "--set", "cost_model.hardware=h900"]) == 2
    assert "cost_model.hardware: unknown hardware preset 'h900'" in capsys.readouterr().err


# ---- strict parsing -----------------------------------------------------------------------


def test_a_boolean_where_a_number_is_expected_names_the_key(tmp_path: Path) -> None:
    from simulator.cli import main

    with pytest.raises(
        InputError, match=r"scheduler\.max_num_seqs: expected a number, got the boolean true"
    ):
        load_scenario(QUICKSTART, {"scheduler.max_num_seqs": True})
    data = yaml.safe_load(QUICKSTART.read_text())
    data["workload"]["prompt_len"]["sigma"] = False
    with pytest.raises(InputError, match=r"workload\.prompt_len\.sigma: expected a number"):
        load_scenario(_write(tmp_path, data))
    data = yaml.safe_load(QUICKSTART.read_text())
    data["metrics"] = {"percentiles": [50, True]}
    with pytest.raises(InputError, match=r"metrics\.percentiles\.1: expected a number"):
        load_scenario(_write(tmp_path, data))
    assert main(["validate", str(QUICKSTART), "--set", "scheduler.max_num_seqs=true"]) == 2


def test_a_number_where_a_boolean_is_expected_names_the_key() -> None:
    from pydantic import BaseModel

    from simulator.strict_types import find_loose_scalar

    class Flags(BaseModel):
        on: bool
        n: int

    assert find_loose_scalar({"on": 1, "n": 2}, Flags(on=True, n=2)) == (
        "on: expected true or false, got the number 1"
    )
    assert find_loose_scalar({"on": True, "n": 2}, Flags(on=True, n=2)) is None


def test_a_key_given_twice_is_an_error_with_its_lines(tmp_path: Path) -> None:
    text = QUICKSTART.read_text() + "scheduler: {max_num_batched_tokens: 64, max_num_seqs: 2}\n"
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    first = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("scheduler:"))
    last = len(text.splitlines())
    with pytest.raises(
        InputError,
        match=rf"twice\.yaml:{last}: invalid YAML: key 'scheduler' given twice "
        rf"\(first on line {first}\)",
    ):
        load_scenario(path)


def test_numbers_in_exponent_notation_are_numbers(tmp_path: Path) -> None:
    """``1e3`` and ``2.5e1`` are numbers, as YAML 1.2 and every user read them (PyYAML alone
    read them as strings, and a count of ``1e3`` was "unable to parse string as an integer"),
    also in ``--set``; a quoted one stays a string, and a fractional count is still refused."""
    from simulator.scenario.config import parse_overrides

    text = QUICKSTART.read_text()
    data = yaml.safe_load(text)
    assert data["workload"]["num_requests"] != 1000
    data["workload"]["num_requests"] = "__COUNT__"
    data["workload"]["arrival"]["rate"] = "__RATE__"
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data).replace("__COUNT__", "1e3").replace("__RATE__", "2.5e1"))
    cfg = load_scenario(path)
    assert cfg.workload.num_requests == 1000 and cfg.workload.arrival.rate == 25.0
    assert parse_overrides(["a=2e1", "b=-1.5E-2", "c='1e3'", "d=1e3x"]) == {
        "a": 20.0,
        "b": -0.015,
        "c": "1e3",
        "d": "1e3x",
    }
    path.write_text(path.read_text().replace("num_requests: 1e3", "num_requests: 1e-3"))
    with pytest.raises(InputError, match="workload.num_requests"):
        load_scenario(path)


def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin1\.yaml:1: not UTF-8 text \(byte 0xe9\)"):
        load_scenario(path)


def test_changing_a_distribution_with_set_replaces_its_parameters() -> None:
    cfg = load_scenario(
        QUICKSTART,
        {"workload.prompt_len.value": 128, "workload.prompt_len.dist": "fixed"},
    )
    assert cfg.workload.prompt_len is not None
    assert cfg.workload.prompt_len.model_dump() == {"dist": "fixed", "value": 128}
    same = load_scenario(QUICKSTART, {"workload.prompt_len.dist": "lognormal"})
    assert same.workload.prompt_len == load_scenario(QUICKSTART).workload.prompt_len
    linear = load_scenario(QUICKSTART, {"cost_model.type": "linear", "cost_model.base_ms": 3})
    assert linear.cost_model.type == "linear"
