"""``benchmarks/bench_eval.py`` without ``vllm serve``: both gold replays at one task per split / domain, and
the in-process (``hf``) throughput on the FinMCP fixture with the untrained tiny model."""

from __future__ import annotations

import math

from envace.bench.finmcp import FinMcpAdapter
from envace.common.results import read_results


def test_selfchecks_replay_both_benchmarks(script) -> None:
    results: dict = {}
    script("bench_eval").selfchecks(results, limit=1)
    assert set(results) == {"selfcheck_bfcl_multi_turn", "selfcheck_tau2"}
    for name, check in results.items():
        assert "skipped" not in check, f"{name}: {check}"
        assert check["total"] > 0 and check["passed"] == check["total"] and check["seconds"] >= 0, name


def test_in_process_throughput_on_the_finmcp_fixture(script, tiny_model_dir, tmp_path) -> None:
    bench = script("bench_eval")
    stats = bench.throughput("hf", tiny_model_dir, 1, tmp_path)
    fixture = bench.ROOT / "tests/data/finmcp/fixture.json"
    n_tasks = len(FinMcpAdapter({"data": str(fixture)}).load_tasks(["all"], None))
    assert stats["samples"] == n_tasks == len(read_results(tmp_path / "hf.jsonl").lines)
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert stats["samples_per_s"] > 0 and 0 <= stats["share_outside_model"] <= 1
    assert stats["server_startup_s"] == 0
