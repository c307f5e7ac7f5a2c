"""``benchmarks/warmstart_spread.py`` without its builds: the config ``envace tiny-model`` reads (the
overlay's curriculum, scaled), and the held-out success of a build on two of the overlay's ledger tasks."""

from __future__ import annotations

import argparse

import yaml

from envace.cli.tiny_model import resolve_settings
from envace.common.config import load_config


def test_derived_config_is_the_scaled_curriculum_tiny_model_reads(script, tmp_path) -> None:
    spread = script("warmstart_spread")
    args = spread.parser().parse_args(["--out", str(tmp_path), "--lr-scale", "0.5", "--last-steps", "7"])
    config = spread.write_config(tmp_path, 3, args)
    overlay = yaml.safe_load((spread.REPO / "config/smoke_ledger.yaml").read_text())
    cfg = load_config(config)
    assert cfg["benchmarks"]["ledger"] == overlay["benchmarks"]["ledger"]
    tiny = argparse.Namespace(config=str(config), seed=None, warmstart=None, threads=None)
    resolve_settings(tiny)
    curriculum = overlay["tiny_model"]["warmstart"]
    assert tiny.seed == 3 and len(tiny.stages) == len(curriculum)
    assert [s.lr for s in tiny.stages] == [stage["lr"] * 0.5 for stage in curriculum]
    assert [s.steps for s in tiny.stages] == [stage["steps"] for stage in curriculum[:-1]] + [7]
    local = {(str(tmp_path / f"ledger_{split}.jsonl"),) for split in ("train", "world")}
    read = {p.data for s in tiny.stages for p in s.parts()}
    assert {(str(tmp_path / "ledger_train.jsonl"),)} <= read <= local


def test_success_of_a_build(script, tiny_model_dir) -> None:
    spread = script("warmstart_spread")
    ledger = spread.ledger_spec()
    overlay = yaml.safe_load((spread.REPO / "config/smoke_ledger.yaml").read_text())
    assert ledger == overlay["benchmarks"]["ledger"]["ledger"] and ledger["n_test"] > 2
    assert 0 <= spread.success(tiny_model_dir, 1, {**ledger, "n_test": 2}) <= 1
