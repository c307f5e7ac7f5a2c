"""``benchmarks/bench_smoke.py``'s report (without ``--run``) on what a finished smoke run leaves behind,
made by hand: Snakemake's benchmark files, evaluation / TTS manifests and a fidelity document."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _benchmark(results: Path, rel: str, *seconds: float) -> None:
    """A Snakemake ``benchmark:`` file, one row per repeat."""
    path = results / "benchmarks" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + "".join(f"{s}\t0:00:01\t1\t1\t1\t1\t0\t0\t50\t{s}\n" for s in seconds))


def _doc(results: Path, rel: str, serving: dict, timing: dict | None = None) -> None:
    """A manifest or fidelity document with its ``serving`` record (and ``timing``)."""
    path = results / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"complete": True, "serving": serving, **({"timing": timing} if timing else {})}
    path.write_text(json.dumps(doc))


def _server(index: int, ready_s: float, launches: int = 1) -> dict:
    """One ``serving.servers`` entry."""
    return {"index": index, "launches": launches, "model_path": "models/smoke/tiny", "ready_s": ready_s,
            "roles": ["model"]}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """Two training jobs, one evaluation job (two manifests: CPU totals running, its second server shared by
    the fidelity document), a TTS job, a figure, and a rule whose benchmark file is still empty."""
    _benchmark(tmp_path, "train/envace_8b.tsv", 300.0)
    _benchmark(tmp_path, "train/grpo_8b.tsv", 100.0)
    _benchmark(tmp_path, "evaluate_all.tsv", 200.0)
    _benchmark(tmp_path, "tts_evaluate/tau2.tsv", 50.0)
    _benchmark(tmp_path, "figure/fig3.tsv", 2.0, 4.0)  # a rerun: the last row counts
    _benchmark(tmp_path, "summary/x.tsv")
    timing = {"wall_s": 10.0, "model_s": 8.0, "samples": 3.0, "server_cpu_s": 50.0, "process_cpu_s": 10.0}
    _doc(tmp_path, "eval/m/finmcp/seed0.manifest.json", {"job": "E", "servers": [_server(0, 17.5)]}, timing)
    _doc(tmp_path, "eval/m/tau2/seed0.manifest.json",
         {"job": "E", "servers": [_server(0, 17.5), _server(1, 20.0, launches=2)]},
         {**timing, "wall_s": 30.0, "server_cpu_s": 70.0, "process_cpu_s": 15.0})
    _doc(tmp_path, "tts/parallel_n2_envace/tau2/seed0.manifest.json",
         {"job": "T", "servers": [_server(0, 5.0)]},
         {**timing, "wall_s": 20.0, "server_cpu_s": 5.0, "process_cpu_s": 2.0})
    _doc(tmp_path, "fidelity/m/ledger.json", {"job": "E", "servers": [_server(1, 20.0, launches=2)]})
    return tmp_path


def test_tables_from_benchmark_files_and_manifests(script, results, capsys) -> None:
    script("bench_smoke").main(["--results", str(results)])
    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| rule")]
    assert rows == [["train", "2", "400", "200.0", "300.0", "61%"],
                    ["evaluate_all", "1", "200", "200.0", "200.0", "31%"],
                    ["tts_evaluate", "1", "50", "50.0", "50.0", "8%"],
                    ["figure", "1", "4", "4.0", "4.0", "1%"],
                    ["all", "5", "654", "", "", "100%"]]
    assert "4 starts in 2 jobs; start-up to healthy median 18 s, max 20 s, 42 s in all." in out
    assert re.search(r"\(3 result files\): 250 s wall in all, of which 60 s in the sample loops", out), out
    assert "model servers (model, user simulator, rehearser) 75 s (82%)" in out
    assert "the envace eval processes (harness, benchmark environments, imports) 17 s (18%)" in out


def test_no_benchmark_files_says_run_it_first(script, tmp_path) -> None:
    with pytest.raises(SystemExit, match="run the smoke DAG first"):
        script("bench_smoke").main(["--results", str(tmp_path)])
