"""Time `snakemake -n all` on the paper config (target: under 10 s on 2 cores).

Usage: .venv/bin/python benchmarks/bench_dag.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
#: (label, extra arguments) of each timed plan
PLANS = [("paper config", []), ("paper config, slurm profile", ["--profile", "slurm"])]


def plan_medians(snakemake: str, repeats: int) -> Iterator[tuple[str, float]]:
    """``(label, median wall seconds)`` of ``snakemake -n all`` (run in the repository) for each plan of
    :data:`PLANS`, as each finishes."""
    for label, extra in PLANS:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            subprocess.run([snakemake, "-n", "all", *extra], cwd=ROOT, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        yield label, statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for label, median in plan_medians(SNAKEMAKE, args.repeats):
        print(f"snakemake -n all ({label}): median {median:.2f} s over {args.repeats} runs")


if __name__ == "__main__":
    main()
