"""Replay LLMServingSim's three real vLLM runs (scenarios/real-*.yaml) against their
measurements, time each whole replay, and write the end-to-end table at the top of
docs/fidelity.md (between its END-TO-END markers) and the ``kernels`` cost model's replays of
the RTX PRO 6000 runs with their speed against ``profiled`` (its KERNELS markers), from
../shared/data/llmservingsim, else
data/llmservingsim (after ``servesim fetch llmservingsim``).

    .venv/bin/python benchmarks/real_runs.py            # table + timings
    .venv/bin/python benchmarks/real_runs.py --check    # exit 1 if docs/fidelity.md is stale
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.validation.real_runs import (  # noqa: E402
    KERNELS_MARKERS,
    KERNELS_RUNS,
    RUNS,
    end_to_end_table,
    kernels_table,
    replace_between_markers,
)
from tests.paths import DATA  # noqa: E402

DOC = ROOT / "docs" / "fidelity.md"


def time_replays(repeat: int) -> None:
    """Best-of-``repeat`` wall time of one whole ``servesim compare SCENARIO MEASURED``
    process (start-up, imports, profile, simulation, comparison; with and without the
    figure), run where ``data/llmservingsim`` is the shared copy, as after ``servesim fetch
    llmservingsim``."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "data").mkdir()
        (Path(tmp) / "data" / "llmservingsim").symlink_to(DATA / "llmservingsim")
        for run in RUNS:
            args = [
                str(ROOT / ".venv" / "bin" / "servesim"),
                "compare",
                str(ROOT / "scenarios" / f"{run.scenario}.yaml"),
                f"data/llmservingsim/{run.measured}",
            ]
            for extra in ([], ["--plot", f"{tmp}/figure.png"]):
                best, cpu = float("inf"), float("inf")
                for _ in range(repeat):
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.perf_counter()
                    subprocess.run([*args, *extra], check=True, capture_output=True, cwd=tmp)
                    best = min(best, time.perf_counter() - t0)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                    cpu = min(cpu, used)
                label = f"{run.scenario}{' + figure' if extra else ''}"
                print(f"{label}: {best:.2f} s wall, {cpu:.2f} s CPU (best of {repeat})")


_REPLAY = """
import sys, time
from pathlib import Path
t0 = time.perf_counter()
from simulator.validation.real_runs import RUNS, replay
run = next(r for r in RUNS if r.scenario == sys.argv[1])
replay(run, Path(sys.argv[2]), Path(sys.argv[3]), kernels=sys.argv[4] == "kernels")
print(time.perf_counter() - t0)
"""


def time_kernels(repeat: int) -> None:
    """Best-of-``repeat`` time of one whole replay (a fresh process: imports, cost model,
    simulation, comparison) of each run on a measured GPU with ``kernels`` and with the
    scenario's ``profiled``, measured alternately, and their ratio."""
    python = str(ROOT / ".venv" / "bin" / "python")
    for run in KERNELS_RUNS:
        best = {"kernels": float("inf"), "profiled": float("inf")}
        cpu = dict(best)
        for _ in range(repeat):
            for kind in best:
                args = [python, "-c", _REPLAY, run.scenario, str(ROOT), str(DATA / "llmservingsim")]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                done = subprocess.run([*args, kind], check=True, capture_output=True, text=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                best[kind] = min(best[kind], float(done.stdout.split()[-1]))
                cpu[kind] = min(cpu[kind], used)
        print(
            f"{run.scenario}: kernels {best['kernels']:.2f} s wall, {cpu['kernels']:.2f} s CPU; "
            f"profiled {best['profiled']:.2f} s wall, {cpu['profiled']:.2f} s CPU "
            f"(x{best['kernels'] / best['profiled']:.2f} wall, "
            f"x{cpu['kernels'] / cpu['profiled']:.2f} CPU, best of {repeat})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check docs/fidelity.md")
    parser.add_argument("--repeat", type=int, default=5, help="timing repeats")
    args = parser.parse_args()
    table = end_to_end_table(DATA / "llmservingsim")
    text = DOC.read_text()
    kernels = kernels_table(DATA / "llmservingsim")
    new = replace_between_markers(replace_between_markers(text, table), kernels, KERNELS_MARKERS)
    if args.check:
        print("docs/fidelity.md is current" if new == text else "docs/fidelity.md is stale")
        return int(new != text)
    DOC.write_text(new)
    print(table)
    print(kernels)
    time_kernels(args.repeat)
    time_replays(args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
