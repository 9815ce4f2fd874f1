"""Steps per second of the scheduler alone, with a large steady batch of decoding sequences.

Run by hand: ``.venv/bin/python benchmarks/scheduler_bench.py``; record results in README.md.
"""

from __future__ import annotations

import argparse
import platform
import time

from simulator.scheduler import Scheduler, Sequence


def bench(num_seqs: int, steps: int, prompt_len: int, block_size: int) -> float:
    """Steps/s of schedule()+update() with ``num_seqs`` sequences decoding for ``steps`` steps."""
    sched = Scheduler(
        num_blocks=num_seqs * ((prompt_len + steps) // block_size + 2),
        block_size=block_size,
        max_num_seqs=num_seqs,
        max_num_batched_tokens=max(num_seqs * prompt_len, 8192),
        sample_fn=lambda seq: 1,
    )
    for i in range(num_seqs):
        sched.add(Sequence(i, prompt_len, steps + 2))
    sched.schedule()  # the prefill step, not timed
    sched.update()
    start = time.perf_counter()
    for _ in range(steps):
        sched.schedule()
        sched.update()
    elapsed = time.perf_counter() - start
    assert len(sched.running) == num_seqs  # nobody finished or was preempted: a pure decode batch
    return steps / elapsed


def main() -> None:
    """Print steps/s for a few batch sizes."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()} ({platform.processor()})")
    for n in (1, 32, 256):
        rate = max(bench(n, args.steps, 512, 16) for _ in range(3))
        print(f"{n:4d} running sequences: {rate:10,.0f} steps/s  ({rate * n:12,.0f} seq-steps/s)")


if __name__ == "__main__":
    main()
