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
    assert {"envace_8b: no REHEARSE rows", "envace_8b: every reward equal in every batch",
            "envace_8b: no trajectory earned a positive reward"} <= set(problems), problems
