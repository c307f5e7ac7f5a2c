"""Time `snakemake -n all` on the paper config (target: under 10 s on 2 cores).

Usage: .venv/bin/python benchmarks/bench_dag.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    for label, extra in [("paper config", []), ("paper config, slurm profile", ["--profile", "slurm"])]:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            subprocess.run([snakemake, "-n", "all", *extra], cwd=ROOT, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        print(f"snakemake -n all ({label}): median {statistics.median(times):.2f} s over {args.repeats} runs")


if __name__ == "__main__":
    main()
