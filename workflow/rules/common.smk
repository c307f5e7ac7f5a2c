# Helpers shared by all rules: the validated config, the experiment matrix and the file layout.
# The report's per-sample inputs (eval_files, tts_files) come from envace.common.results.eval_path / tts_path,
# the CLI's layout; the rules' output patterns follow it (tests/test_workflow.py plans a target built
# with eval_path).
import json
import os
import shlex
from pathlib import Path

import yaml

from envace.common.config import (
    complete_config,
    config_hash,
    eval_hash,
    evaluation_pairs,
    fig5_rehearse_runs,
    figure5_models,
    learning_models,
    learning_seeds,
    ours_benchmarks,
    released_models,
    training_key,
    tts_benchmarks,
    tts_hash,
)
from envace.train.data import local_source_path
from envace.train.verl_ext.launch import service_models
from envace.common.results import FIGURE_FILES, eval_path, tts_path
from envace.report.points import FIG3_BENCHMARK, FIG4_BENCHMARKS

CFG = complete_config(config, source="snakemake config")


# our benchmarks beside the paper's (Tables 1-3, Figures 3-6), and the TTS ones: tts.benchmarks, then OURS
OURS = ours_benchmarks(CFG)
TTS_BENCHMARKS = tts_benchmarks(CFG)
RESULTS = CFG["paths"]["results"]
FIGURES = CFG["paths"]["figures"]
MODELS_DIR = CFG["paths"]["models"]
DATA_DIR = CFG["paths"]["data"]
CKPT_DIR = CFG["paths"]["checkpoints"]
# Report rules read per-sample results from here; a different root (e.g. shipped example results)
# has no producing rule, so the report slice then runs without training or evaluation.
REPORT_SOURCE = CFG["report_source"] or RESULTS
IS_SMOKE = CFG["scale"] == "smoke"
TINY_MODEL = f"{MODELS_DIR}/tiny"
# The cluster environment (used with `--sdm conda`); on CPU the project's .venv provides everything.
CONDA_ENV = "../../environment.yml"
WORKFLOW_PROFILE = (
    Path(workflow.basedir) / "workflow" / "profiles" / "default" / "config.yaml"
)


def profile_resources(name):
    """The `set-resources` entry `name` of the workflow profile, for rules whose names the config makes
    (evaluate_released_<model>): a profile can only list names it knows. Snakemake still lets a profile
    entry of the rule's own name override these."""
    return yaml.safe_load(WORKFLOW_PROFILE.read_text())["set-resources"][name]


# the splits rule ledger_records writes; world = the REHEARSE warm-start data
LEDGER_SPLITS = (
    "train",
    "test",
    "world",
)


def ledger_records_file(split):
    """The ledger's reference records of one split as the DAG writes them (rule ledger_records)."""
    return f"{DATA_DIR}/ledger_{split}.jsonl"


def dag_made(path):
    """True where `path` is a records file a rule of this DAG writes (the ledger's; see data.smk)."""
    return os.path.normpath(path) in {
        os.path.normpath(ledger_records_file(s)) for s in LEDGER_SPLITS
    }


def _check_training_source():
    """training.data.source, checked at planning time: a local path must be an existing file or one the
    DAG writes (dag_made); a Hugging Face dataset id is left to `envace data`. Fails the plan with the
    key and the path, not a job later.
    """
    source = CFG["training"]["data"]["source"]
    path = local_source_path(source)
    if path is not None and not path.is_file() and not dag_made(source):
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ValueError(
            f"config key training.data.source: the local training data file '{source}' {what} "
            f"(looked for {path.resolve()}); fix the path, or give a Hugging Face dataset id"
        )


def training_source_input():
    """prepare_training_data's input: the local records file (so a change re-runs it), else nothing."""
    source = CFG["training"]["data"]["source"]
    return [source] if local_source_path(source) is not None else []


_check_training_source()


wildcard_constraints:
    model=r"[a-z0-9_]+(-step\d{4})?",
    run=r"[a-z0-9_]+",
    benchmark=r"[a-z0-9_]+",
    setting=r"[a-z0-9_]+",
    seed=r"\d+",


# ---------------------------------------------------------------- specs (rerun keys)
def _write_spec(path, payload):
    """Write a spec file only when its content changes, so its mtime is a config-change trigger.

    Training and evaluation rules take a spec file as input: with mtime-only rerun triggers (the
    slurm profile) an edited Snakefile does not re-run training, while a changed hyperparameter does.
    """
    path = Path(path)
    text = json.dumps(payload, indent=1, sort_keys=True) + "\n"
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)


def ledger_spec(split):
    """The ledger_records outputs depend on benchmarks.ledger (its generator settings: seed,
    sizes, show_balances), so a changed setting rewrites the records (and re-trains what reads them).
    """
    bench = CFG["benchmarks"].get("ledger") or {}
    payload = {"split": split, "ledger": bench.get("ledger") or {}}
    return _write_spec(f"{RESULTS}/specs/ledger/{split}.json", payload)


def run_spec(run):
    spec = CFG["training"]["runs"][run]
    payload = {
        "run": run,
        # the run plus training.data / judge / reward / reward_rules (envace.common.config.training_key)
        "hash": config_hash(training_key(CFG, run)),
        "spec": spec,
        "scale": CFG["scale"],
    }
    return _write_spec(f"{RESULTS}/specs/train/{run}.json", payload)


def eval_spec(model, benchmark):
    payload = {
        "model": model,
        "benchmark": benchmark,
        "hash": eval_hash(CFG, model, benchmark),
    }
    return _write_spec(f"{RESULTS}/specs/eval/{model}/{benchmark}.json", payload)


def tts_spec(setting, benchmark):
    payload = {
        "setting": setting,
        "benchmark": benchmark,
        "hash": tts_hash(CFG, setting, benchmark),
    }
    return _write_spec(f"{RESULTS}/specs/tts/{setting}/{benchmark}.json", payload)


def fidelity_spec(model, benchmark):
    """What a fidelity result depends on besides its evaluation files: report.fidelity's pairs and
    REHEARSE settings, the bootstrap and the vLLM flags."""
    fid = {k: v for k, v in FIDELITY.items() if k not in ("models", "benchmarks")}
    payload = {
        "model": model,
        "benchmark": benchmark,
        "hash": config_hash(
            {
                "fidelity": fid,
                "bootstrap": CFG["report"]["bootstrap"],
                "serving": CFG.get("serving", {}).get("vllm"),
            }
        ),
    }
    return _write_spec(f"{RESULTS}/specs/fidelity/{model}/{benchmark}.json", payload)


# Every `envace` command reads this resolved config (config files plus --config overrides), so the
# CLI and the DAG always see the same matrix. Not an input of any job: changing one model must not re-run all.
RESOLVED_CONFIG = _write_spec(f"{RESULTS}/specs/config.resolved.json", CFG)


# ---------------------------------------------------------------- models
def split_checkpoint(model):
    """'envace_8b-step0050' -> ('envace_8b', 50); a plain model id -> (model, None)."""
    run, sep, step = model.rpartition("-step")
    return (run, int(step)) if sep and step.isdigit() else (model, None)


def model_entry(model):
    run, step = split_checkpoint(model)
    if step is not None:
        return {
            "kind": "trained",
            "run": run,
            "size": CFG["models"].get(run, {}).get("size", "8B"),
        }
    return CFG["models"][model]


def model_ready(model):
    """The file that says a model can be served: training done-file, tiny model, or nothing (HF id)."""
    entry = model_entry(model)
    if entry["kind"] == "trained":
        return [f"{RESULTS}/train/{entry['run']}/done.json"]
    if entry["kind"] == "tiny":
        return [f"{TINY_MODEL}/done.json"]
    return []


def _warmstart_stages():
    return CFG.get("tiny_model", {}).get("warmstart", [])


def tiny_model_data():
    """The records files of the tiny model's warm-start stages (each stage's and each of its mix items'
    data: a file or a list)."""
    files = []
    for stage in _warmstart_stages():
        for part in [stage, *stage.get("mix", [])]:
            data = part["data"]
            files += [data] if isinstance(data, str) else list(data)
    return list(dict.fromkeys(files))


def tiny_model_args():
    """`envace tiny-model` flags from the config's tiny_model block (seed, pinned threads, warm-start
    stages as JSON)."""
    tiny = CFG.get("tiny_model", {})
    stages = json.dumps(_warmstart_stages(), separators=(",", ":"))
    return (
        f"--seed {tiny.get('seed', 0)} --threads {tiny.get('threads', 2)} "
        f"--warmstart {shlex.quote(stages)}"
    )


def model_gpus(model):
    if IS_SMOKE:
        return 0
    return CFG["resources"]["serve_gpus"].get(model_entry(model).get("size", "8B"), 1)


def job_gpus(models, benchmark):
    """GPUs of one evaluation job: each served model plus the benchmark's user simulator / judge."""
    if IS_SMOKE:
        return 0
    bench = CFG["benchmarks"][benchmark]
    helpers = {bench[k] for k in ("user_simulator", "judge") if k in bench}
    helper_gpus = CFG["resources"]["serve_gpus"].get("30B", 4) * len(helpers)
    return sum(model_gpus(m) for m in set(models)) + helper_gpus


def eval_gpus(wildcards):
    return job_gpus([wildcards.model], wildcards.benchmark)


# ---------------------------------------------------------------- the matrix
def eval_pairs():
    """Every (model, benchmark) evaluated with all seeds: Tables 1-2 and the Figure 5 checkpoints."""
    return evaluation_pairs(CFG)


def eval_files(model, benchmark, root=None, seeds=None):
    root = root or REPORT_SOURCE
    return [str(eval_path(root, model, benchmark, s)) for s in seeds or CFG["seeds"]]


def learning_files():
    """The learning check's result files (report.learning: base and trained models on our benchmarks,
    each with the check's seeds)."""
    seeds = learning_seeds(CFG)
    return [
        f
        for m in learning_models(CFG)
        for b in OURS
        for f in eval_files(m, b, seeds=seeds)
    ]


def tts_files(setting, benchmark, root=None):
    root = root or REPORT_SOURCE
    return [str(tts_path(root, setting, benchmark, s)) for s in CFG["tts"]["seeds"]]


# ---------------------------------------------------------------- report inputs (one place)
def table_inputs(table):
    if table in ("table1", "table2"):
        block = CFG["evaluation"][table]
        # each released checkpoint's row follows its counterpart's
        swap = released_models(CFG)
        models = [
            x for m in block["models"] for x in [m, *([swap[m]] if m in swap else [])]
        ]
        return [
            f
            for m in models
            for b in [*block["benchmarks"], *OURS]
            for f in eval_files(m, b)
        ]
    if table == "table3":
        return [
            f
            for s in CFG["tts"]["table3"].values()
            for b in TTS_BENCHMARKS
            for f in tts_files(s, b)
        ]
    raise ValueError(f"unknown table {table}")


def figure_inputs(figure):
    if figure == "fig3":
        return [
            f
            for m in CFG["report"]["fig3"].values()
            for b in [FIG3_BENCHMARK, *OURS]
            for f in eval_files(m, b)
        ]
    if figure == "fig4":
        models = [m for sizes in CFG["report"]["fig4"].values() for m in sizes.values()]
        return [
            f
            for m in models
            for b in [*FIG4_BENCHMARKS, *OURS]
            for f in eval_files(m, b)
        ]
    if figure == "fig5":
        benches = [CFG["evaluation"]["checkpoints"]["benchmark"], *OURS]
        # the REHEARSE panel's done-files: only when this DAG trains (a report_source has its own, if any)
        done = (
            [f"{RESULTS}/train/{r}/done.json" for r in fig5_rehearse_runs(CFG)]
            if REPORT_SOURCE == RESULTS
            else []
        )
        return [
            f
            for m in figure5_models(CFG).values()
            for b in benches
            for f in eval_files(m, b)
        ] + done
    if figure == "fig6":
        return [
            f
            for s in CFG["tts"]["settings"]
            for b in TTS_BENCHMARKS
            for f in tts_files(s, b)
        ]
    raise ValueError(f"unknown figure {figure}")


FIGURE_NAMES = FIGURE_FILES
TABLES = ["table1", "table2", "table3"]


FIDELITY = CFG["report"].get("fidelity")


def fidelity_outputs():
    """Rehearsal-fidelity table and figure; only over results this DAG produces (shipped synthetic
    results carry no trajectories)."""
    if not FIDELITY or REPORT_SOURCE != RESULTS:
        return []
    return [f"{RESULTS}/tables/fidelity.md", f"{FIGURES}/fidelity.pdf"]


def fidelity_models():
    """report.fidelity.models, each followed by its released checkpoint (config `released`) if it has one."""
    swap = released_models(CFG)
    return [
        x for m in FIDELITY["models"] for x in [m, *([swap[m]] if m in swap else [])]
    ]


def fidelity_inputs():
    return [
        f"{RESULTS}/fidelity/{m}/{b}.json"
        for m in fidelity_models()
        for b in FIDELITY["benchmarks"]
    ]


def released_inputs():
    """Target `released`: the released checkpoints' evaluations, their TTS suite, their fidelity
    documents and the released-weights diff; no model we train is among their inputs."""
    swap = released_models(CFG)
    if not swap:
        return []
    evals = [f for m, b in eval_pairs() if m in swap.values() for f in eval_files(m, b)]
    tts = [
        f
        for s in CFG["tts"]["released_settings"]
        for b in TTS_BENCHMARKS
        for f in tts_files(s, b)
    ]
    fidelity = (
        [
            f"{RESULTS}/fidelity/{m}/{b}.json"
            for m in swap.values()
            if m in fidelity_models()
            for b in FIDELITY["benchmarks"]
        ]
        if fidelity_outputs()
        else []
    )
    return evals + tts + fidelity


def report_html_inputs():
    """The reproduction report's parts: Markdown tables and figure PDFs in page order, the diff's JSON."""
    fidelity = fidelity_outputs()
    return {
        "tables": [f"{RESULTS}/tables/{t}.md" for t in TABLES]
        + [f for f in fidelity if f.endswith(".md")],
        "figures": [f"{FIGURES}/{name}.pdf" for name in FIGURE_NAMES.values()]
        + [f for f in fidelity if f.endswith(".pdf")],
        "diff_json": f"{RESULTS}/paper_diff.json",
    }


def all_report_outputs():
    outs = [f"{RESULTS}/report.html"]
    outs += [f"{RESULTS}/tables/{t}.md" for t in TABLES]
    outs += [f"{FIGURES}/{name}.pdf" for name in FIGURE_NAMES.values()]
    outs += [f"{RESULTS}/paper_diff.md"]
    outs += fidelity_outputs()
    outs += [f"{RESULTS}/summary/{m}/{b}.json" for m, b in eval_pairs()]
    outs += [f"{RESULTS}/released_diff.md"] if released_models(CFG) else []
    return outs


# ---------------------------------------------------------------- rule helpers
def train_inputs(wildcards):
    run = CFG["training"]["runs"][wildcards.run]
    base = [m for m, e in CFG["models"].items() if e.get("path") == run["base_model"]]
    ready = model_ready(base[0]) if base else []
    return {
        "spec": run_spec(wildcards.run),
        "data": f"{DATA_DIR}/cm2_train.parquet",
        "val": f"{DATA_DIR}/cm2_val.parquet",
        "base": ready,
    }


def train_nodes(wildcards):
    return CFG["training"]["runs"][wildcards.run]["nodes"]


# A smoke-scale training's memory (MB), from the resident sets of its processes on CPU (docs/measurements.md,
# "Where the CI's time goes"): verl's driver, Ray, TransferQueue, the reward loop and the job's own
# processes; per policy an FSDP worker and its vLLM rollout engine; per served model (GRPO's simulator,
# the checklist judge) a `vllm serve`. As the jobs' Slurm memory (and make smoke's), it keeps a per-role
# run and a run with a served model from sharing a 24 GB machine: together they filled it, Ray's memory
# monitor killed workers and the run waited for their rollouts for ever.
SMOKE_TRAIN_MB = {"base": 4500, "policy": 4300, "served_model": 3000}


def train_mem_mb(wildcards):
    """Memory of a smoke-scale training job (MB); at paper scale the profile's (None here)."""
    if not IS_SMOKE:
        return None
    run = CFG["training"]["runs"][wildcards.run]
    policies = 2 if run.get("roles") == "per_role" else 1
    served = len(set(service_models(CFG, wildcards.run).values()))
    return (
        SMOKE_TRAIN_MB["base"]
        + policies * SMOKE_TRAIN_MB["policy"]
        + served * SMOKE_TRAIN_MB["served_model"]
    )


def train_priority(wildcards):
    """Snakemake's priority of a smoke-scale training: its memory (GB) times its steps, the largest first.
    Trainings that cannot share the machine with each other (the per-role run, those serving a model)
    then start early, each beside a small one, instead of one of them training alone at the end
    (docs/measurements.md). 0 at paper scale (every job is submitted at once)."""
    mem = train_mem_mb(wildcards)
    if mem is None:
        return 0
    return mem // 1000 * int(CFG["training"]["runs"][wildcards.run]["total_steps"])


def train_gres(wildcards):
    """GPUs per node as a generic resource (`--gres=gpu:8` is per node, unlike `--gpus`, which is
    per job and can spread unevenly across nodes). None on CPU."""
    per_node = CFG["training"]["runs"][wildcards.run]["gpus_per_node"]
    return f"gpu:{per_node}" if per_node and not IS_SMOKE else None


def eval_inputs(wildcards):
    return {
        "spec": eval_spec(wildcards.model, wildcards.benchmark),
        "model": model_ready(wildcards.model),
    }


def model_path_arg(model):
    run, step = split_checkpoint(model)
    if step is not None:
        return f"--checkpoint-dir {CKPT_DIR}/{run} --step {step}"
    entry = CFG["models"][model]
    if entry["kind"] == "trained":
        return f"--checkpoint-dir {CKPT_DIR}/{entry['run']}"
    return f"--model-path {entry['path']}"


def figure_rule_inputs(wildcards):
    key = {name: fig for fig, name in FIGURE_NAMES.items()}[wildcards.name]
    return figure_inputs(key)
