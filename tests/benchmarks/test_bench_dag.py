"""``benchmarks/bench_dag.py`` with a stand-in ``snakemake`` that records its calls (the real dry runs of
the paper DAG, with and without the slurm profile, are tests/test_workflow.py's)."""

from __future__ import annotations

import re
from pathlib import Path


def test_times_each_plan_in_the_repository(script, tmp_path, monkeypatch, capsys) -> None:
    bench = script("bench_dag")
    assert Path(bench.SNAKEMAKE).is_file(), "the venv has no snakemake beside its python"
    calls = tmp_path / "calls"
    stub = tmp_path / "snakemake"
    stub.write_text(f'#!/bin/sh\necho "$(pwd -P) $*" >> {calls}\n')
    stub.chmod(0o755)
    monkeypatch.setattr(bench, "SNAKEMAKE", str(stub))
    bench.main(["--repeats", "2"])
    root = bench.ROOT.resolve()
    assert calls.read_text().splitlines() == [f"{root} -n all"] * 2 + [f"{root} -n all --profile slurm"] * 2
    assert (root / "profiles" / "slurm" / "config.yaml").is_file()
    lines = capsys.readouterr().out.splitlines()
    found = [re.fullmatch(r"snakemake -n all \((.+)\): median (\d+\.\d\d) s over 2 runs", x) for x in lines]
    assert [m[1] for m in found if m] == [label for label, _ in bench.PLANS], lines
