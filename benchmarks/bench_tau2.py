"""Benchmark of the tau^2-bench gold replay through the full evaluation runner (a script, not a test).

Times, separately: the one-time setup (tau2's prompt modules, parsing the three domains' tasks and
databases) and :func:`envace.bench.tau2.gold.selfcheck_tau2` per domain — every base task's gold actions
replayed through :func:`envace.bench.runner.run_samples` (scripted agent, scripted gold user, tau2's
evaluators) — and reports CPU time next to wall time (they differ when other processes share the
cores). Every task must pass (278/278 for the full base split).

Usage: ``python benchmarks/bench_tau2.py [--limit N] [--domains airline retail telecom]``
"""

from __future__ import annotations

import argparse
import time

from envace.bench.tau2 import adapter as tau2_adapter
from envace.bench.tau2 import data as tau2_data
from envace.bench.tau2 import gold as tau2_gold


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="tasks per domain (default: all)")
    parser.add_argument("--domains", nargs="+", default=list(tau2_data.DOMAINS), choices=tau2_data.DOMAINS)
    args = parser.parse_args(argv)

    wall, cpu = time.perf_counter(), time.process_time()
    tau2_adapter.Tau2Adapter().load_tasks(args.domains, args.limit)
    for domain in args.domains:
        tau2_data.make_environment(domain)
    print(f"setup: {time.perf_counter() - wall:.1f} s wall, {time.process_time() - cpu:.1f} s CPU")

    passed = total = 0
    replay_wall, replay_cpu = time.perf_counter(), time.process_time()
    for domain in args.domains:
        d_wall, d_cpu = time.perf_counter(), time.process_time()
        d_passed, d_total, _ = tau2_gold.selfcheck_tau2(args.limit, [domain])
        passed, total = passed + d_passed, total + d_total
        print(
            f"{domain}: {d_passed}/{d_total} in {time.perf_counter() - d_wall:.1f} s wall, "
            f"{time.process_time() - d_cpu:.1f} s CPU"
        )
    replay = time.perf_counter() - replay_wall
    print(
        f"replay: {passed}/{total} in {replay:.1f} s wall, {time.process_time() - replay_cpu:.1f} s CPU "
        f"({total / replay:.1f} tasks/s)"
    )
    print(f"total: {time.perf_counter() - wall:.1f} s wall, {time.process_time() - cpu:.1f} s CPU")
    return 0 if passed == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
