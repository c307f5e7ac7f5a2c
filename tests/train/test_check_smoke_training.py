"""CI's check of the smoke DAG's training runs (benchmarks/check_smoke_training.py) on hand-made run
folders: what verl's console step lines and file logger leave behind, per run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_smoke_training",
                                               ROOT / "benchmarks" / "check_smoke_training.py")
check_smoke_training = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_smoke_training)

RUNS = {"envace_8b": {"roles": "shared"}, "per_role_8b": {"roles": "per_role"}}


def _row(step: int, **extra: float) -> dict:
    data = {"envace/rows/act": 3.0, "envace/rows/rehearse": 2.0, "critic/score/max": 1.0,
            "critic/score/min": 0.0, "envace/termination/final_answer": 1.0, **extra}
    return {"step": step, "data": data}


def _write(tmp: Path, run: str, rows: list[dict]) -> None:
    logs = tmp / "results" / "logs" / "train"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{run}.log").write_text("".join(f"step:{r['step']} - x:1\n" for r in rows))
    ck = tmp / "checkpoints" / run
    ck.mkdir(parents=True, exist_ok=True)
    (ck / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _check(tmp: Path) -> list[str]:
    return check_smoke_training.check(tmp / "results", tmp / "checkpoints", RUNS)


def _synced(step: int) -> dict:
    return _row(step, **{"envace/rollout_actor_corr/act": 0.9997,
                         "envace/rollout_actor_corr/rehearse": 0.9996})


def test_healthy_runs_pass(tmp_path):
    _write(tmp_path, "envace_8b", [_row(n, **{"envace/rollout_actor_corr/shared": 0.999}) for n in (1, 2, 3)])
    _write(tmp_path, "per_role_8b", [_synced(n) for n in (1, 2, 3)])
    assert _check(tmp_path) == []


def test_per_role_agreement_missing_at_one_step_or_low_fails(tmp_path):
    _write(tmp_path, "envace_8b", [_row(n) for n in (1, 2, 3)])
    rows = [_synced(1), _row(2, **{"envace/rollout_actor_corr/act": 0.9995}), _synced(3)]
    rows[2]["data"]["envace/rollout_actor_corr/act"] = 0.97
    _write(tmp_path, "per_role_8b", rows)
    problems = _check(tmp_path)
    assert len(problems) == 2 and all(p.startswith("per_role_8b: ") for p in problems), problems
    assert "act policy's rollout-vs-actor agreement 0.9700" in problems[0], problems
    assert "rehearse policy's rollout-vs-actor agreement not logged" in problems[1], problems


def test_equal_rewards_missing_run_and_no_rehearse_rows_fail(tmp_path):
    flat = [_row(n, **{"critic/score/max": 0.0, "envace/rows/rehearse": 0.0}) for n in (1, 2, 3)]
    _write(tmp_path, "envace_8b", flat)
    problems = _check(tmp_path)
    assert "per_role_8b: configured but no training log" in problems[0], problems
    assert {"envace_8b: no REHEARSE rows", "envace_8b: every reward equal (0.000) at every step",
            "envace_8b: no trajectory earned a positive reward",
            "every batch of every run held equal rewards (no GRPO update had a non-zero advantage)"
            } == set(problems[1:]), problems


def test_uniform_batches_fail_only_when_every_run_has_them(tmp_path):
    """A run whose batches are each uniform (all 0, then all 1) passes while another run's batch had a
    spread; the same in every run fails the DAG. A run with one reward throughout fails on its own."""
    uniform = [_row(1, **{"critic/score/max": 0.0}), *(_row(n, **{"critic/score/min": 1.0}) for n in (2, 3))]
    _write(tmp_path, "envace_8b", uniform)
    _write(tmp_path, "per_role_8b", [_synced(n) for n in (1, 2, 3)])
    assert _check(tmp_path) == []
    for row in (rows := [_synced(n) for n in (1, 2, 3)]):
        row["data"].update({"critic/score/min": 1.0})
    _write(tmp_path, "per_role_8b", rows)
    assert _check(tmp_path) == [
        "per_role_8b: every reward equal (1.000) at every step",
        "every batch of every run held equal rewards (no GRPO update had a non-zero advantage)"]


def _learning(model: str, low: float | None, status: str) -> dict:
    entry = {"model": model, "base_model": "qwen3_8b", "benchmark": "ledger", "training_seed": 0,
             "base": 50.4, "trained": 63.3, "status": status}
    if low is None:
        entry["missing"] = [f"eval/{model}/ledger/seed1.jsonl"]
    else:
        entry.update(point=12.9, ci_low=low, ci_high=19.9)
    return entry


def test_learning_check_wants_every_listed_model_to_rise(tmp_path):
    spec = {"base": "qwen3_8b", "models": ["envace_8b", "envace_1p7b", "envace_8b_seed2"]}
    diff = tmp_path / "paper_diff.json"
    learn = check_smoke_training.check_learning
    assert learn(diff, None) == []  # no report.learning: nothing to check
    assert "no paper diff" in learn(diff, spec)[0]
    diff.write_text(json.dumps({"learning": [_learning("envace_8b", 5.9, "RISES"),
                                             _learning("envace_1p7b", 8.4, "RISES"),
                                             _learning("envace_8b_seed2", 7.4, "RISES")]}))
    assert learn(diff, spec) == []
    diff.write_text(json.dumps({"learning": [_learning("envace_8b", 5.9, "RISES"),
                                             _learning("envace_1p7b", -5.0, "NO_RISE"),
                                             _learning("envace_8b_seed2", None, "MISSING")]}))
    problems = learn(diff, spec)
    assert len(problems) == 2 and "envace_1p7b on ledger: NO_RISE" in problems[0] and "MISSING" in problems[1]
    diff.write_text(json.dumps({"learning": [_learning("envace_8b", 5.9, "RISES")]}))
    assert sorted(p.split(":")[0] for p in learn(diff, spec)) == ["envace_1p7b", "envace_8b_seed2"]


def test_config_files_merge_as_snakemake_merges_them():
    cfg = check_smoke_training.merged([ROOT / "config/smoke.yaml", ROOT / "config/smoke_ledger.yaml"])
    runs = cfg["training"]["runs"]
    assert runs["envace_8b"]["total_steps"] == 15 and runs["envace_8b"]["roles"] == "shared"  # merged keys
    assert runs["per_role_8b"]["roles"] == "per_role" and runs["envace_8b_seed2"]["seed"] == 2
    assert cfg["report"]["learning"]["models"] == ["envace_8b", "envace_1p7b", "envace_8b_seed2"]
    assert cfg["evaluation"]["episode"]["turn_cap"] == "every_turn"  # kept from smoke.yaml


def test_trained_runs_are_the_runs_the_tables_and_figures_name():
    smoke = check_smoke_training.merged([ROOT / "config/smoke.yaml"])
    assert sorted(check_smoke_training.trained_runs(smoke)) == [
        "envace_1p7b", "envace_8b", "grpo_1p7b", "grpo_8b", "per_role_8b"]
    ledger = check_smoke_training.merged([ROOT / "config/smoke.yaml", ROOT / "config/smoke_ledger.yaml"])
    assert "grpo_1p7b" in ledger["training"]["runs"]  # kept by the merge, named by no table or figure
    assert sorted(check_smoke_training.trained_runs(ledger)) == [
        "envace_1p7b", "envace_8b", "envace_8b_seed2", "grpo_8b", "per_role_8b"]
