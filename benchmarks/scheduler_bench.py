"""Steps per second of the scheduler alone, with a large steady batch of decoding sequences.

Run by hand: ``.venv/bin/python benchmarks/scheduler_bench.py``; record results in README.md.
"""

from __future__ import annotations

import argparse
import platform
import time

from simulator.scheduling import Sequence, StepScheduler


def bench(num_seqs: int, steps: int, prompt_len: int, block_size: int, deferred: bool) -> float:
    """Steps/s of ``num_seqs`` sequences decoding for ``steps`` steps, through
    schedule()+update() or, with ``deferred``, fast_step() + finish_fast_step() (settled by
    one final schedule())."""
    sched = StepScheduler(
        num_blocks=num_seqs * ((prompt_len + steps) // block_size + 2),
        block_size=block_size,
        max_num_seqs=num_seqs,
        max_num_batched_tokens=max(num_seqs * prompt_len, 8192),
        sample_fn=lambda seq: 1,
        sample_many=lambda seq, k: [1] * k,
    )
    for i in range(num_seqs):
        sched.add(Sequence(i, prompt_len, steps + 2))
    sched.schedule()  # the prefill step, not timed
    sched.update()
    start = time.perf_counter()
    if deferred:
        fast_step, finish = sched.fast_step, sched.finish_fast_step
        for _ in range(steps - 1):
            plan = fast_step()
            assert plan is not None and plan.num_deferred == num_seqs
            finish()
    for _ in range(1 if deferred else steps):
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
    for deferred in (False, True):
        print("fast_step() + one settle" if deferred else "schedule() + update()")
        for n in (1, 32, 256):
            rate = max(bench(n, args.steps, 512, 16, deferred) for _ in range(3))
            print(f"  {n:4d} running: {rate:12,.0f} steps/s  ({rate * n:13,.0f} seq-steps/s)")


if __name__ == "__main__":
    main()
