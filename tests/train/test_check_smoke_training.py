"""CI's check of the smoke DAG's training runs (benchmarks/check_smoke_training.py) on hand-made run
folders: what verl's console step lines and file logger leave behind, per run."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from envace.common.config import merge_config_files

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_smoke_training",
                                               ROOT / "benchmarks" / "check_smoke_training.py")
check_smoke_training = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_smoke_training)

RUNS = {"envace_8b": {"roles": "shared", "total_steps": 3},
        "per_role_8b": {"roles": "per_role", "total_steps": 3}}
GRPO = {"algorithm": "grpo", "roles": "shared", "total_steps": 3}
SERVED = "starting vllm serve ... envace.simulator.base_url=http://127.0.0.1:8000/v1\n"


def _row(step: int, **extra: float) -> dict:
    data = {"envace/rows/act": 3.0, "envace/rows/rehearse": 2.0, "critic/score/max": 1.0,
            "critic/score/min": 0.0, "envace/termination/final_answer": 1.0, "critic/advantages/max": 0.7,
            "critic/advantages/min": -0.7, "actor/grad_norm": 0.3, **extra}
    return {"step": step, "data": data}


def _write(tmp: Path, run: str, rows: list[dict], log: str = "") -> None:
    """A run's outputs as the DAG leaves them: rule log, verl's metrics.jsonl, done-file, checkpoints."""
    logs = tmp / "results" / "logs" / "train"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{run}.log").write_text(log + "".join(f"step:{r['step']} - x:1\n" for r in rows))
    ck = tmp / "checkpoints" / run
    ck.mkdir(parents=True, exist_ok=True)
    (ck / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    last = max((r["step"] for r in rows), default=0)
    (ck / "latest_checkpointed_iteration.txt").write_text(str(last))
    for policy in ("actor", "rehearse_actor"):
        hf = ck / f"global_step_{last}" / policy / "huggingface"
        hf.mkdir(parents=True, exist_ok=True)
        (hf / "model.safetensors").write_bytes(b"w")
    done = tmp / "results" / "train" / run / "done.json"
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps({"run": run, "last_step": last, "versions": {"verl": "0.9.1"}}))


def _check(tmp: Path) -> list[str]:
    return check_smoke_training.check(tmp / "results", tmp / "checkpoints", RUNS)


UPDATES = {"actor/pg_loss": 0.1, "rehearse_actor/pg_loss": 0.2}


def _synced(step: int) -> dict:
    return _row(step, **{"envace/rollout_actor_corr/act": 0.9997,
                         "envace/rollout_actor_corr/rehearse": 0.9996, **UPDATES})


def test_healthy_runs_pass(tmp_path):
    _write(tmp_path, "envace_8b", [_row(n, **{"envace/rollout_actor_corr/shared": 0.999}) for n in (1, 2, 3)])
    _write(tmp_path, "per_role_8b", [_synced(n) for n in (1, 2, 3)])
    assert _check(tmp_path) == []


def test_the_authors_padding_must_log_its_copies_at_every_step(tmp_path, capsys):
    """A run with batch_padding copy logs envace/padding/copied_rows at every step (per role: the ACT
    policy's key bare, the REHEARSE policy's under "rehearse/"); a step without it fails."""
    runs = {**RUNS, "per_role_8b": {**RUNS["per_role_8b"], "batch_padding": "copy"}}
    _write(tmp_path, "envace_8b", [_row(n, **{"envace/rollout_actor_corr/shared": 0.999}) for n in (1, 2, 3)])
    rows = [_synced(n) for n in (1, 2, 3)]
    for n, row in enumerate(rows):
        row["data"].update({"envace/padding/copied_rows": 1.0, "rehearse/envace/padding/copied_rows": n})
    _write(tmp_path, "per_role_8b", rows)
    assert check_smoke_training.check(tmp_path / "results", tmp_path / "checkpoints", runs) == []
    printed = capsys.readouterr().out
    assert "per_role_8b: rows copied by the authors' batch padding per step [1.0, 2.0, 3.0]" in printed
    del rows[1]["data"]["envace/padding/copied_rows"], rows[1]["data"]["rehearse/envace/padding/copied_rows"]
    _write(tmp_path, "per_role_8b", rows)
    assert check_smoke_training.check(tmp_path / "results", tmp_path / "checkpoints", runs) == [
        "per_role_8b: batch_padding copy, but envace/padding/copied_rows is missing at some step"]


def test_group_filtering_must_log_its_refills_at_every_step(tmp_path, capsys):
    """A run with filter_groups on logs the prompts it drew at every step (verl logs the groups it filtered
    only in steps that filtered some); a step without the count fails."""
    runs = {**RUNS, "envace_8b": {**RUNS["envace_8b"], "filter_groups": {"enable": True}}}
    rows = [_row(n, **{"envace/rollout_actor_corr/shared": 0.999,
                       "envace/filter_groups/refilled_prompts": 2 * n}) for n in (1, 2, 3)]
    rows[0]["data"]["training/filter_groups/evicted_samples"] = 3.0
    rows[1]["data"]["envace/filter_groups/capped"] = 1
    _write(tmp_path, "envace_8b", rows)
    _write(tmp_path, "per_role_8b", [_synced(n) for n in (1, 2, 3)])
    assert check_smoke_training.check(tmp_path / "results", tmp_path / "checkpoints", runs) == []
    assert ("envace_8b: group filtering: groups without a signal replaced per step [3, 0, 0], prompts drawn "
            "[2, 4, 6], steps that reached the bound [2]") in capsys.readouterr().out
    del rows[2]["data"]["envace/filter_groups/refilled_prompts"]
    _write(tmp_path, "envace_8b", rows)
    assert check_smoke_training.check(tmp_path / "results", tmp_path / "checkpoints", runs) == [
        "envace_8b: filter_groups on, but envace/filter_groups/refilled_prompts is missing at some step"]


def test_per_role_agreement_missing_at_one_step_or_low_fails(tmp_path):
    _write(tmp_path, "envace_8b", [_row(n, **{"envace/rollout_actor_corr/shared": 0.999}) for n in (1, 2, 3)])
    rows = [_synced(1), _row(2, **{"envace/rollout_actor_corr/act": 0.9995}, **UPDATES), _synced(3)]
    rows[2]["data"]["envace/rollout_actor_corr/act"] = 0.97
    _write(tmp_path, "per_role_8b", rows)
    problems = _check(tmp_path)
    assert len(problems) == 2 and all(p.startswith("per_role_8b: ") for p in problems), problems
    assert "act policy's rollout-vs-actor agreement 0.9700 (1 steps failed)" in problems[0], problems
    assert "rehearse policy's rollout-vs-actor agreement 0.9996 (1 steps missing)" in problems[1], problems


def test_an_undefined_agreement_is_decided_by_the_probabilities(tmp_path):
    """A collapsed policy (constant token probabilities) logs a NaN correlation: the step agrees when the
    mean probability difference is small, and fails when it is not (or was not logged)."""
    rows = [_row(n, **{"envace/rollout_actor_corr/shared": 0.999}) for n in (1, 2, 3)]
    rows[1]["data"].update({"envace/rollout_actor_corr/shared": float("nan"),
                            "envace/rollout_actor_prob_diff/shared": 0.002})
    _write(tmp_path, "envace_8b", rows)
    _write(tmp_path, "per_role_8b", [_synced(n) for n in (1, 2, 3)])
    assert _check(tmp_path) == []
    rows[1]["data"]["envace/rollout_actor_prob_diff/shared"] = 0.2
    _write(tmp_path, "envace_8b", rows)
    assert _check(tmp_path) == ["envace_8b: shared policy's rollout-vs-actor agreement 0.9990 (1 steps "
                                "failed) (want >= 0.99 at every step)"]


def test_equal_rewards_missing_run_and_no_rehearse_rows_fail(tmp_path):
    flat = [_row(n, **{"critic/score/max": 0.0, "envace/rows/rehearse": 0.0,
                       "envace/rollout_actor_corr/shared": 0.999}) for n in (1, 2, 3)]
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
    corr = {"envace/rollout_actor_corr/shared": 0.999}
    uniform = [_row(1, **{"critic/score/max": 0.0}, **corr), *(_row(n, **{"critic/score/min": 1.0}, **corr)
                                                              for n in (2, 3))]
    _write(tmp_path, "envace_8b", uniform)
    _write(tmp_path, "per_role_8b", [_synced(n) for n in (1, 2, 3)])
    assert _check(tmp_path) == []
    for row in (rows := [_synced(n) for n in (1, 2, 3)]):
        row["data"].update({"critic/score/min": 1.0})
    _write(tmp_path, "per_role_8b", rows)
    assert _check(tmp_path) == [
        "per_role_8b: every reward equal (1.000) at every step",
        "every batch of every run held equal rewards (no GRPO update had a non-zero advantage)"]


def test_a_run_logs_each_step_once_and_ends_with_its_checkpoint(tmp_path):
    """Outputs a killed-and-resumed run could get wrong: a step logged twice or skipped, a done-file or
    checkpoint short of total_steps, no HF weights, a per-role step without the REHEARSE policy."""
    corr = {"envace/rollout_actor_corr/shared": 0.999}
    _write(tmp_path, "envace_8b", [_row(n, **corr) for n in (1, 2, 2, 3)])
    rows = [_synced(n) for n in (1, 2, 3)]
    del rows[1]["data"]["rehearse_actor/pg_loss"]
    _write(tmp_path, "per_role_8b", rows)
    (tmp_path / "checkpoints" / "per_role_8b" / "global_step_2").mkdir()
    assert _check(tmp_path) == [
        "envace_8b: verl's metrics.jsonl logged steps [1, 2, 2, 3] (want 1..3, each once)",
        "per_role_8b: global_step_2 has no rehearse_actor/ (the REHEARSE policy was not checkpointed)",
        "per_role_8b: step 2 did not update both policies (actor/pg_loss, rehearse_actor/pg_loss)"]
    _write(tmp_path, "per_role_8b", [_synced(n) for n in (1, 2, 3)])
    shutil.rmtree(tmp_path / "checkpoints" / "envace_8b" / "global_step_3")
    _write(tmp_path, "envace_8b", [_row(n, **corr) for n in (1, 2)])  # stopped after step 2
    problems = [p for p in _check(tmp_path) if p.startswith("envace_8b: ")]
    assert problems[0] == "envace_8b: verl's metrics.jsonl logged steps [1, 2] (want 1..3, each once)"
    assert "verl step lines [1, 2]" in problems[1] and "last_step 2" in problems[2], problems
    assert "latest_checkpointed_iteration.txt is not 3" in problems[3] and "no HF weights in" in problems[4]


def test_standard_grpo_has_no_rehearse_rows_and_a_served_simulator(tmp_path):
    corr = {"envace/rollout_actor_corr/shared": 0.999}
    runs = {"grpo_8b": GRPO}
    _write(tmp_path, "grpo_8b", [_row(n, **corr, **{"envace/rows/rehearse": 0.0}) for n in (1, 2, 3)], SERVED)
    assert check_smoke_training.check(tmp_path / "results", tmp_path / "checkpoints", runs) == []
    _write(tmp_path, "grpo_8b", [_row(n, **corr) for n in (1, 2, 3)])
    assert check_smoke_training.check(tmp_path / "results", tmp_path / "checkpoints", runs) == [
        "grpo_8b: standard GRPO trained 6 REHEARSE rows (want 0)",
        "grpo_8b: its log shows no simulator served by vllm serve"]


def test_a_checklist_reward_run_shows_its_judge_verdicts(tmp_path, capsys):
    corr = {"envace/rollout_actor_corr/shared": 0.999, "envace/rows/rehearse": 0.0}
    runs = {"grpo_8b": {**GRPO, "reward": "checklist"}}
    judged = {"envace/judge/verdicts": 6.0, "envace/judge/failures": 1.0, "envace/judge/failed_share": 0.25}
    _write(tmp_path, "grpo_8b", [_row(n, **corr, **judged) for n in (1, 2, 3)], SERVED)
    assert check_smoke_training.check(tmp_path / "results", tmp_path / "checkpoints", runs) == []
    assert "grpo_8b: checklist reward: 18 judge verdicts over 3 steps, 3 failed" in capsys.readouterr().out
    flat = {"critic/score/max": 1.0, "critic/score/min": 1.0}  # the judge passed every item of every rollout
    _write(tmp_path, "grpo_8b", [_row(n, **corr, **judged, **flat) for n in (1, 2, 3)], SERVED)
    only_dag = ["every batch of every run held equal rewards (no GRPO update had a non-zero advantage)"]
    assert check_smoke_training.check(tmp_path / "results", tmp_path / "checkpoints", runs) == only_dag
    assert "grpo_8b: every reward equal (1.000): the judge's verdicts did not vary" in capsys.readouterr().out
    runs = {"grpo_8b": GRPO}  # the same flat rewards from a verifiable reward fail
    assert check_smoke_training.check(tmp_path / "results", tmp_path / "checkpoints", runs) == [
        "grpo_8b: every reward equal (1.000) at every step", *only_dag]
    runs = {"grpo_8b": {**GRPO, "reward": "checklist"}}
    _write(tmp_path, "grpo_8b", [_row(n, **corr) for n in (1, 2, 3)], SERVED)  # no judge ran
    assert check_smoke_training.check(tmp_path / "results", tmp_path / "checkpoints", runs) == [
        "grpo_8b: trained with the checklist reward but the judge gave no verdict (0 asked, 0 failed; "
        "envace/judge/* in metrics.jsonl)"]


def test_a_dag_without_an_update_or_with_an_unsynced_shared_policy_fails(tmp_path):
    flat = {"critic/advantages/max": 0.0, "critic/advantages/min": 0.0,
            "envace/rollout_actor_corr/shared": 0.5}
    _write(tmp_path, "envace_8b", [_row(n, **flat) for n in (1, 2, 3)])
    _write(tmp_path, "per_role_8b", [_synced(n) for n in (1, 2, 3)])
    for row in (rows := [_synced(n) for n in (1, 2, 3)]):
        row["data"]["actor/grad_norm"] = 0.0
    _write(tmp_path, "per_role_8b", rows)
    assert _check(tmp_path) == [
        "envace_8b: shared policy's rollout-vs-actor agreement 0.5000 (3 steps failed) (want >= 0.99 at "
        "every step)",
        "no step of any run had advantages of both signs and a non-zero actor/grad_norm"]


def test_checkpoint_evaluations_serve_the_checkpoint(tmp_path):
    cfg = merge_config_files([ROOT / "config/smoke.yaml"])
    results = tmp_path / "results"
    problems = check_smoke_training.check_checkpoint_evals(results, cfg)
    folder = results / "eval" / "envace_8b-step0002"
    assert problems == [f"envace_8b-step0002: no evaluation manifest in {folder}"]
    manifest = results / "eval" / "envace_8b-step0002" / "tau2" / "seed0.manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"model": "checkpoints/smoke/envace_8b/global_step_4/actor/huggingface",
                                    "server": {"kind": "vllm"}}))
    assert "does not name global_step_2" in check_smoke_training.check_checkpoint_evals(results, cfg)[0]
    manifest.write_text(manifest.read_text().replace("global_step_4", "global_step_2"))
    assert check_smoke_training.check_checkpoint_evals(results, cfg) == []


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
    cfg = merge_config_files([ROOT / "config/smoke.yaml", ROOT / "config/smoke_ledger.yaml"])
    runs = cfg["training"]["runs"]
    assert runs["envace_8b"]["total_steps"] == 10 and runs["envace_8b"]["roles"] == "shared"  # merged keys
    assert runs["per_role_8b"]["roles"] == "per_role" and runs["envace_8b_seed2"]["seed"] == 2
    assert cfg["report"]["learning"]["models"] == ["envace_8b", "envace_1p7b", "envace_8b_seed2"]
    assert cfg["evaluation"]["episode"]["turn_cap"] == "every_turn"  # kept from smoke.yaml


def test_trained_runs_are_the_runs_the_tables_and_figures_name():
    smoke = merge_config_files([ROOT / "config/smoke.yaml"])
    assert sorted(check_smoke_training.trained_runs(smoke)) == [
        "envace_1p7b", "envace_8b", "grpo_1p7b", "grpo_8b", "per_role_8b"]
    ledger = merge_config_files([ROOT / "config/smoke.yaml", ROOT / "config/smoke_ledger.yaml"])
    assert sorted(check_smoke_training.trained_runs(ledger)) == [
        "envace_1p7b", "envace_8b", "envace_8b_seed2", "grpo_1p7b", "grpo_8b", "per_role_8b"]
    assert check_smoke_training.trained_runs(ledger)["grpo_1p7b"]["reward"] == "checklist"
    assert check_smoke_training.trained_runs(ledger)["grpo_8b"]["reward"] == "reference_grounded"
    ledger["report"]["fig4"]["grpo"]["1.7B"] = "grpo_8b"
    ledger["evaluation"]["table1"]["models"].remove("grpo_1p7b")
    assert "grpo_1p7b" in ledger["training"]["runs"]  # configured, named by no table or figure: not trained
    assert "grpo_1p7b" not in check_smoke_training.trained_runs(ledger)
