"""Check the smoke DAG's training runs: each trained with verl's ``main_ppo`` (its own step lines in the
run's log, one for every step its last attempt trained: after a resume, those after the checkpoint), the
EnvACE runs' batches held ACT and REHEARSE rows, a run's rewards were not all equal over its steps and
some trajectory earned a positive reward (a spread made only of the -0.1 blank-row penalty, with every
episode ending at its first malformed rehearsal, fails), and some batch of some run held unequal rewards
(a GRPO update with a non-zero advantage). One run's batches may each be uniform by chance at smoke scale
(4 steps of 2 prompts x 2 rollouts; a CI run saw ``envace_8b`` with no in-batch spread at any step and a
best reward of 1.0), so the in-batch spread is printed per run and
required of the DAG, not of each run. A per-role run (``roles: per_role`` in the config) logged both
policies' rollout-vs-actor agreement (``envace/rollout_actor_corr/act`` and ``.../rehearse``) at every
step, each at least ``MIN_AGREEMENT``. Prints each run's episode endings
(``envace/termination/*``), lowest agreement per policy and its REHEARSE answers' exact match with the
references (``envace/rehearse/reference_exact``) at its first and last step. Where the config has
``report.learning`` (``config/smoke_ledger.yaml``), every listed model's ``trained - base`` on each of our
benchmarks must RISE in the paper diff (``<results>/paper_diff.json``, ``learning``: the paired bootstrap
interval over tasks lies above 0).

Per run, from its outputs (:func:`check_outputs`): verl's file logger holds every step 1..total_steps
exactly once (a resumed run must not log a step twice nor skip one); the done-file says the run ended at
``total_steps`` and records verl's version; the last checkpoint is ``total_steps`` with HF weights
(``actor/huggingface/*.safetensors``), and a per-role run updated both policies at every step and
checkpointed both at every saved step; every trained policy's rollout-vs-actor agreement (a shared run's
on all its rows) is at least ``MIN_AGREEMENT`` at every step (where the correlation is undefined, for a
policy deterministic on every sampled token, the mean probability difference is at most
``MAX_UNDEFINED_DIFF``); a standard-GRPO run has no REHEARSE row and
got its observations from a simulator that ``envace train`` served with ``vllm serve``; a run trained with
the checklist reward (the paper's; ``reward`` of the run or ``training.reward``) logged judge verdicts
(``envace/judge/verdicts``), more than failed ones, and prints them with the failures; every other run
had some reward spread (the tiny judge's verdicts are near-constant: a checklist run's rewards may all be
equal; at smoke scale they were 0 to 1 in some runs, all 1.0 in others). Of the DAG: some
step of some run had advantages of both signs and a non-zero gradient (a GRPO update happened), and each
Figure 5 checkpoint evaluation served that checkpoint's weights (``global_step_N`` and vLLM in its
manifests).
Reads the config, the rule logs (``<results>/logs/train/<run>.log``), verl's metrics
(``<checkpoints>/<run>/metrics.jsonl``) and the diff. Exit 1 with the reasons if a check fails.

Usage: ``python benchmarks/check_smoke_training.py results/smoke checkpoints/smoke [CONFIG ...]``
(several config files merge in order, as Snakemake's ``--configfile``; default ``make smoke``'s
``config/smoke.yaml config/smoke_ledger.yaml``)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from envace.common.config import evaluation_pairs, figure5_models, merge_config_files, run_reward

STEP = re.compile(r"step:(\d+) - ")
EXACT = "envace/rehearse/reference_exact"  # REHEARSE answers equal to the reference response, per step
CORR = "envace/rollout_actor_corr/"
REFILLED = "envace/filter_groups/refilled_prompts"  # group filtering: replacement prompts drawn, per step
CAPPED = "envace/filter_groups/capped"  # 1: the step reached envace.max_filter_refill_batches, kept the rest
EVICTED = "training/filter_groups/evicted_samples"  # verl's: groups filtered in the step (absent = none)
PADDING = "envace/padding/copied_rows"  # rows the authors' batch padding copied, per step (and role)
DIFF = "envace/rollout_actor_prob_diff/"
SMOKE_CONFIGS = [Path(__file__).resolve().parents[1] / "config" / name
                 for name in ("smoke.yaml", "smoke_ledger.yaml")]
MIN_AGREEMENT = 0.99  # a synced policy measures ~0.9997 on CPU; unsynced REHEARSE weights measured 0.002
MAX_UNDEFINED_DIFF = 0.01  # mean |p_rollout - p_actor| of a synced policy on CPU: 0.001-0.003


def agreement(rows: list[dict], policy: str) -> dict[str, float]:
    """A policy's agreement over a run's steps: ``low``, the lowest defined correlation (inf if none);
    ``undefined``, steps whose correlation was undefined (NaN) and whose probabilities agreed; ``failed``,
    steps below ``MIN_AGREEMENT`` or undefined with a larger difference; ``missing``, steps without it."""
    out = {"low": float("inf"), "undefined": 0, "failed": 0, "missing": 0}
    for r in rows:
        if CORR + policy not in r:
            out["missing"] += 1
            continue
        corr, diff = float(r[CORR + policy]), float(r.get(DIFF + policy, "nan"))
        if corr != corr:  # NaN
            out["undefined" if diff <= MAX_UNDEFINED_DIFF else "failed"] += 1
            continue
        out["low"] = min(out["low"], corr)
        out["failed"] += corr < MIN_AGREEMENT
    return out


def _agreement_text(a: dict[str, float]) -> str:
    parts = [f"{a['low']:.4f}" if a["low"] < float("inf") else "no defined value"]
    if a["undefined"]:
        parts.append(f"{a['undefined']} steps undefined, probabilities within {MAX_UNDEFINED_DIFF}")
    parts += [f"{a[k]} steps {k}" for k in ("failed", "missing") if a[k]]
    return parts[0] + (f" ({'; '.join(parts[1:])})" if parts[1:] else "")


def check(results: Path, checkpoints: Path, runs_cfg: dict) -> list[str]:
    problems = []
    any_batch_spread = any_update = False
    logs = sorted((results / "logs" / "train").glob("*.log"))
    if not logs:
        return [f"no training logs in {results / 'logs' / 'train'}"]
    problems += [f"{run}: configured but no training log in {results / 'logs' / 'train'}"
                 for run in sorted(set(runs_cfg) - {log.stem for log in logs})]
    for log in logs:
        run = log.stem
        steps = sorted({int(m) for m in STEP.findall(log.read_text(errors="replace"))})
        metrics_file = checkpoints / run / "metrics.jsonl"
        lines = metrics_file.read_text().splitlines() if metrics_file.is_file() else []
        rows = [json.loads(x)["data"] for x in lines]
        rehearse = sum(float(r.get("envace/rows/rehearse", 0)) for r in rows)
        act = sum(float(r.get("envace/rows/act", 0)) for r in rows)
        spread = max((float(r["critic/score/max"]) - float(r["critic/score/min"]) for r in rows), default=0.0)
        best = max((float(r["critic/score/max"]) for r in rows), default=0.0)
        worst = min((float(r["critic/score/min"]) for r in rows), default=0.0)
        any_batch_spread |= spread > 0
        ends = {k.removeprefix("envace/termination/"): sum(float(r.get(k, 0)) for r in rows) / len(rows)
                for k in sorted({k for r in rows for k in r if k.startswith("envace/termination/")})}
        corr = {k.removeprefix(CORR): agreement(rows, k.removeprefix(CORR))
                for k in sorted({k for r in rows for k in r if k.startswith(CORR)})}
        exact = [float(r[EXACT]) for r in rows if EXACT in r]
        print(f"{run}: verl step lines {steps or 'none'}; rows ACT {act:.0f} REHEARSE {rehearse:.0f}; "
              f"largest in-batch reward spread {spread:.3f}; rewards {worst:.3f} to {best:.3f}; episode ends "
              + (", ".join(f"{k} {v:.0%}" for k, v in ends.items()) or "not logged")
              + "; lowest rollout-vs-actor agreement "
              + (", ".join(f"{k} {_agreement_text(v)}" for k, v in corr.items()) or "not logged")
              + "; answers equal to the reference "
              + (f"{exact[0]:.0%} at the first step, {exact[-1]:.0%} at the last" if exact else "not logged"))
        # the trained policies: a per-role run's two; a shared run's one, on all its rows ("shared"; its
        # per-role subsets, "shared/act" and "shared/rehearse", are printed: a step may have no row of one)
        policies = ("act", "rehearse") if runs_cfg.get(run, {}).get("roles") == "per_role" else ("shared",)
        for policy in policies:
            a = corr.get(policy)
            if a is None or a["failed"] or a["missing"]:
                seen = _agreement_text(a) if a else "not logged"
                problems.append(f"{run}: {policy} policy's rollout-vs-actor agreement {seen} "
                                f"(want >= {MIN_AGREEMENT} at every step)")
        if runs_cfg.get(run, {}).get("batch_padding") == "copy":  # per-role runs log "<role>/envace/..."
            copied = [[float(v) for k, v in r.items() if k.endswith(PADDING)] for r in rows]
            print(f"{run}: rows copied by the authors' batch padding per step {[sum(c) for c in copied]}")
            if not rows or not all(copied):
                problems.append(f"{run}: batch_padding copy, but {PADDING} is missing at some step")
        if (runs_cfg.get(run, {}).get("filter_groups") or {}).get("enable"):
            evicted = [int(float(r.get(EVICTED, 0))) for r in rows]
            capped = [json.loads(x)["step"] for x, r in zip(lines, rows, strict=True)
                      if float(r.get(CAPPED, 0))]
            print(f"{run}: group filtering: groups without a signal replaced per step {evicted}, prompts "
                  f"drawn {[int(float(r.get(REFILLED, 0))) for r in rows]}, steps that reached the bound "
                  f"{capped}")
            if not rows or not all(REFILLED in r for r in rows):
                problems.append(f"{run}: filter_groups on, but {REFILLED} is missing at some step")
        any_update |= any(_updated(r) for r in rows)
        if run in runs_cfg:
            problems += check_outputs(results, checkpoints, run, runs_cfg[run],
                                      [json.loads(x)["step"] for x in lines], rows, log, steps, rehearse)
        elif len(steps) < 3:
            problems.append(f"{run}: {len(steps)} verl step lines in {log} (want >= 3)")
        if not rows:
            problems.append(f"{run}: no metrics in {metrics_file}")
        if act == 0:
            problems.append(f"{run}: no ACT rows")
        if not run.startswith("grpo") and rehearse == 0:
            problems.append(f"{run}: no REHEARSE rows")
        if rows and best <= worst:
            if runs_cfg.get(run, {}).get("reward") == "checklist":  # the tiny judge: near-constant verdicts
                print(f"{run}: every reward equal ({best:.3f}): the judge's verdicts did not vary")
            else:
                problems.append(f"{run}: every reward equal ({best:.3f}) at every step")
        if best <= 0:
            problems.append(f"{run}: no trajectory earned a positive reward")
    if not any_batch_spread:
        problems.append("every batch of every run held equal rewards "
                        "(no GRPO update had a non-zero advantage)")
    elif not any_update:
        problems.append("no step of any run had advantages of both signs and a non-zero actor/grad_norm")
    return problems


def _updated(row: dict) -> bool:
    """A step whose advantages had both signs and whose actor gradient was non-zero: a GRPO update."""
    adv_max, adv_min = (float(row.get(f"critic/advantages/{k}", 0)) for k in ("max", "min"))
    return adv_max > 0 > adv_min and float(row.get("actor/grad_norm", 0)) > 0


def check_outputs(results: Path, checkpoints: Path, run: str, spec: dict, logged: list[int], rows: list[dict],
                  log: Path, log_steps: list[int], rehearse_rows: float) -> list[str]:
    """One run's logged steps (verl's metrics and its last attempt's log), done-file, checkpoints and
    (standard GRPO) served simulator."""
    total = int(spec["total_steps"])
    problems = []
    if logged != list(range(1, total + 1)):
        problems.append(f"{run}: verl's metrics.jsonl logged steps {logged} (want 1..{total}, each once)")
    done_file = results / "train" / run / "done.json"
    done = json.loads(done_file.read_text()) if done_file.is_file() else {}
    # the rule log is its last attempt's: the steps after the checkpoint it resumed from
    want = list(range(int(done.get("resumed_from") or 0) + 1, total + 1))
    if log_steps != want:
        problems.append(f"{run}: verl step lines {log_steps} in {log} (want {want}: the steps its last "
                        "attempt trained)")
    if done.get("last_step") != total or not done.get("versions", {}).get("verl"):
        problems.append(f"{run}: done-file {done_file} says last_step {done.get('last_step')}, verl "
                        f"{done.get('versions', {}).get('verl')} (want {total} and a version)")
    ck = checkpoints / run
    latest = ck / "latest_checkpointed_iteration.txt"
    if not latest.is_file() or latest.read_text().strip() != str(total):
        problems.append(f"{run}: {latest} is not {total}")
    if not list((ck / f"global_step_{total}" / "actor" / "huggingface").glob("*.safetensors")):
        problems.append(f"{run}: no HF weights in {ck / f'global_step_{total}' / 'actor' / 'huggingface'}")
    if spec.get("roles") == "per_role":
        problems += [f"{run}: {d.name} has no rehearse_actor/ (the REHEARSE policy was not checkpointed)"
                     for d in sorted(ck.glob("global_step_*")) if not (d / "rehearse_actor").is_dir()]
        problems += [f"{run}: step {n} did not update both policies (actor/pg_loss, rehearse_actor/pg_loss)"
                     for n, row in zip(logged, rows, strict=True)
                     if not {"actor/pg_loss", "rehearse_actor/pg_loss"} <= set(row)]
    if spec.get("reward") == "checklist":  # the paper's reward inside main_ppo: the judge answered
        verdicts = sum(float(r.get("envace/judge/verdicts", 0)) for r in rows)
        failures = sum(float(r.get("envace/judge/failures", 0)) for r in rows)
        print(f"{run}: checklist reward: {verdicts:.0f} judge verdicts over {len(rows)} steps, "
              f"{failures:.0f} failed; failed trajectories per step "
              + ", ".join(f"{float(r.get('envace/judge/failed_share', 0)):.0%}" for r in rows))
        if verdicts <= failures:
            problems.append(f"{run}: trained with the checklist reward but the judge gave no verdict "
                            f"({verdicts:.0f} asked, {failures:.0f} failed; envace/judge/* in metrics.jsonl)")
    if spec.get("algorithm") == "grpo":
        if rehearse_rows:
            problems.append(f"{run}: standard GRPO trained {rehearse_rows:.0f} REHEARSE rows (want 0)")
        text = log.read_text(errors="replace")
        if "starting vllm serve" not in text or "envace.simulator.base_url=http://" not in text:
            problems.append(f"{run}: its log shows no simulator served by vllm serve")
    return problems


def check_checkpoint_evals(results: Path, cfg: dict) -> list[str]:
    """Each Figure 5 checkpoint model's evaluation manifests name its ``global_step_N`` and vLLM."""
    problems = []
    for step, model in figure5_models(cfg).items():
        if model == cfg["evaluation"]["checkpoints"]["run"]:
            continue  # the run's final model: evaluated as itself
        manifests = sorted((results / "eval" / model).glob("*/*.manifest.json"))
        if not manifests:
            problems.append(f"{model}: no evaluation manifest in {results / 'eval' / model}")
        for path in manifests:
            text = path.read_text()
            if f"global_step_{step}" not in text or "vllm" not in text:
                problems.append(f"{path}: does not name global_step_{step} and vLLM (the checkpoint served)")
    return problems


def check_learning(diff_file: Path, spec: dict | None) -> list[str]:
    """Each ``report.learning`` model RISES on every benchmark of ours in the diff (spec None: no check)."""
    if not spec:
        return []
    if not diff_file.is_file():
        return [f"report.learning is set but there is no paper diff at {diff_file}"]
    entries = json.loads(diff_file.read_text()).get("learning", [])
    problems = [f"{m}: no learning entry in {diff_file}" for m in spec["models"]
                if m not in {e["model"] for e in entries}]
    for e in entries:
        ci = (f"{e['point']:+.1f} [{e['ci_low']:+.1f}, {e['ci_high']:+.1f}]" if e.get("ci_low") is not None
              else "no interval (" + ", ".join(e.get("missing", [])) + ")")
        avg = f", Avg@{len(e['seeds'])}" if e.get("seeds") else ""
        print(f"learning: {e['model']} (training seed {e.get('training_seed')}) on {e['benchmark']}{avg}: "
              f"base {e.get('base')}, trained {e.get('trained')}, trained - base {ci}: {e['status']}")
        if e["status"] != "RISES":
            problems.append(f"{e['model']} on {e['benchmark']}: {e['status']} (trained - base {ci})")
    return problems


def trained_runs(cfg: dict) -> dict:
    """The runs the DAG trains: those of the trained models it evaluates (``evaluation_pairs``: Tables 1-2,
    Figure 5), the TTS actor and rehearsers, Figures 3-4 and the fidelity table use, and the Figure 5
    checkpoint run. A run configured but used nowhere (in no table or figure) is not trained. Each spec
    carries the run's effective ``reward`` (:func:`envace.common.config.run_reward`)."""
    report = cfg["report"]
    used = {m for m, _ in evaluation_pairs(cfg)} | {cfg["tts"]["actor"], *cfg["tts"]["rehearsers"].values()}
    used |= {*report["fig3"].values(), *(m for sizes in report["fig4"].values() for m in sizes.values())}
    used |= set(report.get("fidelity", {}).get("models", []))
    runs = {cfg["models"][m]["run"] for m in used if cfg["models"].get(m, {}).get("kind") == "trained"}
    runs.add(cfg["evaluation"]["checkpoints"]["run"])
    return {run: {**spec, "reward": run_reward(cfg, run)} for run, spec in cfg["training"]["runs"].items()
            if run in runs}


def main() -> int:
    results, checkpoints = (Path(a) for a in sys.argv[1:3])
    cfg = merge_config_files([Path(a) for a in sys.argv[3:]] or SMOKE_CONFIGS)
    problems = check(results, checkpoints, trained_runs(cfg))
    problems += check_checkpoint_evals(results, cfg)
    problems += check_learning(results / "paper_diff.json", cfg.get("report", {}).get("learning"))
    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
