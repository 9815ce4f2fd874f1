"""The documentation that is generated or quoted stays true."""

from __future__ import annotations

from pathlib import Path

from simulator.reference import scenario_reference, splice

ROOT = Path(__file__).resolve().parents[1]


def test_scenario_reference_is_current() -> None:
    doc = (ROOT / "docs" / "scenarios.md").read_text()
    assert splice(doc, scenario_reference()) == doc, (
        "docs/scenarios.md is stale: run `python -m simulator.reference docs/scenarios.md`"
    )


def test_every_scenario_key_has_a_description() -> None:
    table_rows = [r for r in scenario_reference().splitlines() if r.startswith("| `")]
    assert len(table_rows) > 40
    missing = [r.split("|")[1].strip() for r in table_rows if r.rstrip().endswith("|  |")]
    assert not missing, f"config fields without a docstring: {missing}"


def test_readme_shows_the_two_commands_first() -> None:
    readme = (ROOT / "README.md").read_text()
    assert readme.index("make demo") < readme.index("## The commands")
    assert "make test" in readme
