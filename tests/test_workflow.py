"""The Snakemake DAG: the paper matrix plans every job the paper needs; each figure and table is its
own target; the smoke config is the same DAG; resources reach the Slurm executor; bad config fails."""

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from envace.common.results import eval_path

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


@functools.cache
def dry_run(repo_root, *args: str) -> tuple[int, str]:
    """``snakemake <args> -n``: return code and output. Cached: a plan that several tests read is made
    once (each costs ~10 s of Snakemake start-up and DAG building on 2 cores)."""
    proc = subprocess.run(
        [SNAKEMAKE, *args, "-n", "--quiet", "rules"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """``scratch(name)``: a config overlay that moves a smoke plan's results, figures and checkpoints to a
    folder of this module's own. A dry run writes its spec files (and the evaluation plan) under
    paths.results: planned there, the user's results/smoke (and the next ``make smoke``'s rerun
    triggers) stay as they were. One folder per name, so plans of different configs never share a file."""
    root = tmp_path_factory.mktemp("smoke_plans")

    def overlay(name: str) -> str:
        path = root / f"{name}.yaml"
        if not path.exists():
            paths = {k: str(root / name / k) for k in ("results", "figures", "checkpoints")}
            path.write_text(yaml.safe_dump({"paths": paths}))
        return str(path)

    return overlay


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\S+)\s+(\d+)$", table, re.M)}


def test_paper_dag_lists_every_job(repo_root):
    rc, out = dry_run(repo_root, "all")
    assert rc == 0, out
    counts = job_counts(out)
    # 5 runs: EnvACE 8B/1.7B, GRPO 8B/1.7B, per-role 8B
    assert counts["train"] == 5
    # one job per (evaluation block, model), each running all its benchmarks x 4 seeds (Avg@4) with one
    # server start per model path: Table 1 (14 models x 3 benchmarks), Table 2 (3 x FinMCP), Fig. 5
    # (9 intermediate checkpoints x tau2; its 10th point, step 470, is the final model's Table 1 job)
    assert counts["evaluate_table1"] == 14 and counts["evaluate_table2"] == 3
    assert counts["evaluate_checkpoints"] == 9 and "evaluate" not in counts
    # one job per TTS benchmark (tau2, BFCL multi-turn), each running all 13 settings: {parallel,
    # sequential} x N in {1,2,3} x {envace, base} + no TTS
    assert counts["tts_evaluate"] == 2
    # Figure 6 has its own rule (it also writes the context-length CSV)
    assert counts["table"] == 3 and counts["figure"] + counts["figure6"] == 4 and counts["paper_diff"] == 1
    # the released checkpoints (config `released`) wherever ours are: EnvACE-8B on Table 1's three and
    # FinMCP, EnvACE-1.7B on Table 1's three
    assert counts["summary"] == 14 * 3 + 3 + 9 + 4 + 3


def test_released_target_trains_nothing(repo_root):
    """`snakemake released` (the paper config's `released` block): the released checkpoints' evaluations,
    their TTS suite and fidelity, and the released diff, without any training job; `all` runs them too."""
    rc, out = dry_run(repo_root, "released")
    assert rc == 0, out
    counts = job_counts(out)
    assert "train" not in counts and "prepare_training_data" not in counts
    assert counts["evaluate_released_envace_8b_released"] == 1
    assert counts["evaluate_released_envace_1p7b_released"] == 1
    assert counts["tts_evaluate_released"] == 2 and counts["released_diff"] == 1 and counts["fidelity"] == 2
    rc, out = dry_run(repo_root, "all")
    assert rc == 0, out
    assert job_counts(out)["tts_evaluate_released"] == 2


def test_released_target_at_smoke_scale_trains_nothing(repo_root, scratch):
    """`make smoke-released`: with evaluation.one_job the released checkpoints' items form a job of
    their own (evaluate_released), so the target still needs no training job."""
    rc, out = dry_run(repo_root, "released", "--forceall", "--configfile", "config/smoke.yaml",
                      "config/smoke_ledger.yaml", "config/smoke_released.yaml", scratch("released"))
    assert rc == 0, out
    counts = job_counts(out)
    assert "train" not in counts and "evaluate_all" not in counts
    assert counts["evaluate_released"] == counts["released_diff"] == 1


@pytest.mark.parametrize(
    "target, expected",
    [
        # fig3: tau2 for GRPO-8B, per-role-8B, EnvACE-8B (their Table 1 jobs, which also run BFCL-v4 and
        # VitaBench: one job per model and block)
        ("figures/fig3_ablation.pdf",
         {"train": 3, "evaluate_table1": 3, "figure": 1, "prepare_training_data": 1}),
        # table2: FinMCP for EnvACE-8B and two external baselines, and the released EnvACE-8B's row
        ("results/tables/table2.md",
         {"train": 1, "evaluate_table2": 3, "evaluate_released_envace_8b_released": 1, "table": 1,
          "prepare_training_data": 1}),
        # a (model, benchmark) outside every block: one job for all its seeds (the path as the CLI's
        # envace.common.results.eval_path builds it: the rules' output patterns follow that layout)
        (str(eval_path("results", "qwen3_8b", "bfcl_multi_turn", 0)), {"evaluate": 1}),
    ],
)
def test_one_target_plans_only_its_ancestors(repo_root, target, expected):
    rc, out = dry_run(repo_root, target)
    assert rc == 0, out
    counts = job_counts(out)
    counts.pop("total")
    assert counts == expected


def test_smoke_config_is_the_same_dag(repo_root, tmp_path, scratch):
    # --forceall: plan every job even where a local smoke run already produced outputs
    rc, out = dry_run(repo_root, "all", "--forceall", "--configfile", "config/smoke.yaml", scratch("cm2"))
    assert rc == 0, out
    counts = job_counts(out)
    assert counts["train"] == 5 and counts["build_tiny_model"] == 1
    assert "ledger_records" not in counts  # the smoke config alone names no ledger records
    # evaluation.one_job: every evaluation, TTS run and fidelity document in one job
    assert counts["evaluate_all"] == 1 and counts["fidelity_report"] == 1
    assert not {"evaluate", "evaluate_table1", "tts_evaluate", "fidelity"} & set(counts)
    # the same DAG with one job per block: the 7 Table 1 rows the figures need (BFCL, tau2), Table 2
    # (3 x FinMCP), Figure 5's step-2 checkpoint (tau2; step 4 is the last, i.e. envace_8b's Table 1
    # job), each one job for all its benchmarks x 2 seeds (Avg@2); TTS: one job per benchmark for all 13
    # settings; fidelity: one job per (model, benchmark)
    per_block = tmp_path / "per_block.yaml"
    per_block.write_text("evaluation: {one_job: false}\n")
    rc, out = dry_run(repo_root, "all", "--forceall", "--configfile", "config/smoke.yaml", scratch("cm2"),
                      str(per_block))
    assert rc == 0, out
    counts = job_counts(out)
    assert counts["evaluate_table1"] == 7 and counts["evaluate_table2"] == 3
    assert counts["evaluate_checkpoints"] == 1 and "evaluate" not in counts
    assert counts["tts_evaluate"] == 2 and counts["fidelity"] == 4 and "evaluate_all" not in counts


def test_one_job_plan_serves_each_weight_folder_once(repo_root, scratch):
    """The plan of evaluate_all: every model's benchmarks, the TTS runs and the fidelity documents, the
    items of one weight folder adjacent (so `envace eval --plan` starts each path once)."""
    overlay = scratch("ledger")
    rc, out = dry_run(repo_root, "all", "--forceall", "--configfile", "config/smoke.yaml",
                      "config/smoke_ledger.yaml", overlay)
    assert rc == 0, out
    results = yaml.safe_load(Path(overlay).read_text())["paths"]["results"]
    plan = json.loads(Path(results, "specs/eval_plan.json").read_text())
    folders = [json.dumps([i.get("model_path"), i.get("checkpoint_dir"), i.get("step")]) for i in plan]
    runs = [f for i, f in enumerate(folders) if i == 0 or folders[i - 1] != f]
    assert len(runs) == len(set(runs)) == 8  # the tiny model, 6 trained runs, Figure 5's step 5
    assert sum("tts_setting" in i for i in plan) == 1
    assert sum("fidelity_results" in i for i in plan) == 4  # (qwen3_8b, envace_8b) x (bfcl_v4, ledger)
    envace = [i for i in plan if i["model"] == "envace_8b"]
    assert [("tts_setting" in i, "fidelity_results" in i) for i in envace] == [
        (False, False), (False, False), (True, False), (False, True), (False, True)]
    # the learning check's models run the ledger with its seeds (report.learning.seeds: Avg@4), the
    # other benchmarks and models with the tables' seeds (Avg@2)
    assert [(i["benchmark"], i["seed"]) for i in envace[:2]] == [(["bfcl_v4", "tau2", "finmcp"], [0, 1]),
                                                                 (["ledger"], [0, 1, 2, 3])]
    seeds = {(i["model"], b): i["seed"] for i in plan if "benchmark" in i and "tts_setting" not in i
             for b in i["benchmark"]}
    assert seeds["qwen3_8b", "ledger"] == seeds["envace_8b_seed2", "ledger"] == [0, 1, 2, 3]
    assert seeds["grpo_8b", "ledger"] == seeds["qwen3_8b", "bfcl_v4"] == [0, 1]


def test_ledger_overlay_is_the_same_dag_on_the_ledger(repo_root, scratch):
    """`make smoke`: config/smoke_ledger.yaml merged over the smoke config plans the ledger's records
    before the tiny model, six runs (EnvACE at three seeds,
    GRPO with each reward, per-role) and the evaluation job (each Table 1 model, Table 2's two other
    models and the checkpoint also on the ledger, every TTS setting on it too, fidelity on BFCL-v4 and
    the ledger)."""
    rc, out = dry_run(repo_root, "all", "--forceall", "--configfile", "config/smoke.yaml",
                      "config/smoke_ledger.yaml", scratch("ledger"))
    assert rc == 0, out
    counts = job_counts(out)
    assert counts["ledger_records"] == 1 and counts["build_tiny_model"] == 1 and counts["train"] == 6
    assert counts["evaluate_all"] == 1 and counts["summary"] == 28
    assert "evaluate_ours" not in job_counts(dry_run(repo_root, "all")[1])  # the paper DAG: no ledger


def test_world_model_overlay_adds_the_world_records_to_the_same_dag(repo_root, scratch):
    """`make smoke-world-model`: config/smoke_world_model.yaml over the ledger smoke plans the same jobs
    plus the ledger's world records (the warm start's REHEARSE data) and the REHEARSE-side control's
    training."""
    rc, out = dry_run(repo_root, "all", "--forceall", "--configfile", "config/smoke.yaml",
                      "config/smoke_ledger.yaml", "config/smoke_world_model.yaml", scratch("world"))
    assert rc == 0, out
    counts = job_counts(out)
    assert counts["ledger_records"] == 2 and counts["build_tiny_model"] == 1 and counts["train"] == 7
    assert counts["evaluate_all"] == 1


@functools.cache
def _slurm_plan(repo_root) -> str:
    """The paper DAG planned with the slurm profile (every job's resources as the executor gets them)."""
    proc = subprocess.run(
        [SNAKEMAKE, "all", "--profile", "slurm", "-n"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def rule_resources(repo_root, target: str, rule: str) -> str:
    """The resources line of the `rule` job of the paper DAG that writes `target`."""
    for block in re.split(r"^\[.*\]$", _slurm_plan(repo_root), flags=re.M):
        output = re.search(r"^\s*output: (.*)$", block, re.M)
        if f"rule {rule}:" in block and output and target in output[1].split(", "):
            return re.search(r"resources: (.*)", block)[1]
    raise AssertionError(f"no {rule} job writes {target} in the paper DAG")


def test_slurm_profile_renders_gpu_resources(repo_root):
    train = rule_resources(repo_root, "results/train/envace_8b/done.json", "train")
    assert "nodes=2" in train and "gres=gpu:8" in train and "runtime=4320" in train
    assert "slurm_partition=REPLACE-WITH-YOUR-PARTITION" in train
    # Table 1 job (BFCL-v4, tau2, VitaBench): the 8B model (1 GPU) plus the 30B user simulator, which is
    # also VitaBench's judge (one server, 4 GPUs)
    tau2 = rule_resources(repo_root, "results/eval/qwen3_8b/tau2/seed0.jsonl", "evaluate_table1")
    assert "gpu=5" in tau2 and "cpus_per_gpu=8" in tau2 and "slurm_account=" in tau2
    finmcp = rule_resources(repo_root, "results/eval/awm_8b/finmcp/seed0.jsonl", "evaluate_table2")
    assert "gpu=1," in finmcp + ","
    # TTS on tau2: actor (EnvACE-8B, also the EnvACE rehearser), the base rehearser, the user simulator
    tts = rule_resources(repo_root, "results/tts/no_tts/tau2/seed0.jsonl", "tts_evaluate")
    assert "gpu=6" in tts
    # rehearsal fidelity serves the rehearsing 8B model itself (one GPU)
    fid = rule_resources(repo_root, "results/fidelity/envace_8b/tau2.json", "fidelity")
    assert "gpu=1," in fid + "," and "cpus_per_gpu=8" in fid and "runtime=240" in fid


def test_bad_config_override_fails_at_parse_time(repo_root):
    rc, out = dry_run(repo_root, "all", "--config", "seeds=not-a-list")
    assert rc != 0
    assert "seeds" in out


def _parse_resources(text: str) -> dict:
    out = {}
    for item in text.split(", "):
        key, _, value = item.partition("=")
        out[key] = int(value) if value.isdigit() else value
    return out


class _Resources(dict):
    __getattr__ = dict.__getitem__


@pytest.mark.parametrize(
    "target, rule, expected, absent",
    [
        (
            "results/train/envace_8b/done.json",
            "train",
            ["--nodes=2", "--gres=gpu:8", "-t 4320", "--mem 480000", "-p REPLACE-WITH-YOUR-PARTITION"],
            ["--gpus=", "--ntasks-per-gpu"],
        ),
        (
            "results/eval/qwen3_8b/tau2/seed0.jsonl",
            "evaluate_table1",
            ["--gpus=5", "--cpus-per-gpu=8", "-t 2880"],
            ["--ntasks-per-gpu", "--nodes"],
        ),
        # rules whose names the config makes (one per released checkpoint) get the profile's
        # evaluate_released resources, not Snakemake's 1 GB and no time limit
        (
            "results/eval/envace_8b_released/tau2/seed0.jsonl",
            "evaluate_released_envace_8b_released",
            ["--gpus=5", "--cpus-per-gpu=8", "-t 2880", "--mem 128000"],
            ["--ntasks-per-gpu", "--nodes"],
        ),
        (
            "results/tts/released-parallel_n1_envace/tau2/seed0.jsonl",
            "tts_evaluate_released",
            ["--cpus-per-gpu=8", "-t 2880", "--mem 128000"],
            ["--ntasks-per-gpu", "--nodes"],
        ),
    ],
)
def test_rendered_sbatch_line(repo_root, target, rule, expected, absent):
    """Feed the DAG's resources to the Slurm plugin's own sbatch renderer (USER_NEEDS: plugin #316,
    #459 — a GPU job must not be split into one task per GPU)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    resources = _Resources(_parse_resources(rule_resources(repo_root, target, rule)))
    job = type("Job", (), {"resources": resources, "threads": 1})()
    params = {
        "run_uuid": "x",
        "slurm_logfile": "log",
        "comment_str": "c",
        "account": "-A 'REPLACE-WITH-YOUR-ACCOUNT'",
        "partition": f"-p {resources['slurm_partition']}",
        "workdir": None,
    }
    line = get_submit_command(job, params) + set_gres_string(job)
    for flag in expected:
        assert flag in line, line
    for flag in absent:
        assert flag not in line, line


def test_ledger_records_are_made_where_the_config_names_them(repo_root, tmp_path):
    """A warm-start stage and training.data.source may name the ledger's records under paths.data: the
    plan then writes them once (rule ledger_records) before the tiny model and the training parquet,
    although the file does not exist yet."""
    cfg = yaml.safe_load((repo_root / "config/smoke.yaml").read_text())
    cfg["paths"] = {k: str(tmp_path / k) for k in cfg["paths"]}  # nothing made by a local smoke run
    records = f"{cfg['paths']['data']}/ledger_train.jsonl"
    cfg["benchmarks"]["ledger"] = {"package": "envace", "splits": ["test"],
                                   "ledger": {"seed": 0, "n_train": 8, "n_test": 4},
                                   "aggregate": {"metric": "score",
                                                 "groups": {"test": {"weight": 1, "splits": ["test"]}}}}
    cfg["tiny_model"]["warmstart"].append({"data": records, "steps": 1, "lr": 1e-2})
    cfg["training"]["data"]["source"] = records
    config = tmp_path / "ledger.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    for target, expected in [(f"{cfg['paths']['models']}/tiny/done.json",
                              {"ledger_records": 1, "build_tiny_model": 1}),
                             (f"{cfg['paths']['data']}/cm2_train.parquet",
                              {"ledger_records": 1, "prepare_training_data": 1})]:
        rc, out = dry_run(repo_root, target, "--configfile", str(config))
        assert rc == 0, out
        counts = job_counts(out)
        counts.pop("total")
        assert counts == expected
    # (a source that neither exists nor is made by the DAG fails the plan, naming the key:
    # tests/fuzz/test_regressions.py::test_7_a_missing_training_data_file_fails_the_plan)


def test_smoke_trainings_ask_for_the_memory_they_hold(repo_root):
    """At smoke scale each training's mem_mb follows its processes (policies, served models): on a 24 GB
    machine (Slurm's and make smoke's limit: its memory less 1 GB) the per-role run shares the cores with
    an EnvACE run but never with a run that serves a model (together they filled the machine and Ray
    killed workers: a hung run)."""
    proc = subprocess.run(
        [SNAKEMAKE, "-n", "--workflow-profile", "none", "--forcerun", "train", "--configfile",
         "config/smoke.yaml", "config/smoke_ledger.yaml", "--", "all"],
        cwd=repo_root, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    jobs = r"wildcards: run=(\w+)\n(?:\s*priority: \d+\n)?\s*resources: .*?mem_mb=(\d+)"
    mem = {m[1]: int(m[2]) for m in re.finditer(jobs, proc.stdout + proc.stderr)}
    assert {"envace_8b", "per_role_8b", "grpo_8b"} <= set(mem), mem
    limit = 24 * 1024 - 1024
    assert mem["per_role_8b"] + mem["envace_8b"] <= limit < mem["per_role_8b"] + mem["grpo_8b"]
    assert 2 * mem["envace_8b"] <= limit and mem["envace_8b"] < mem["grpo_8b"] < mem["per_role_8b"]
    # the largest first (memory x steps): the runs that cannot share the machine start early, each beside
    # an EnvACE run; the 4-step checklist run last
    prio = {m[1]: int(m[2]) for m in re.finditer(r"wildcards: run=(\w+)\n\s*priority: (\d+)",
                                                    proc.stdout + proc.stderr)}
    assert prio["per_role_8b"] > prio["grpo_8b"] > prio["envace_8b"] == prio["envace_1p7b"]
    assert prio["envace_8b"] > prio["grpo_1p7b"]
