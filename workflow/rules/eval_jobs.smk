# Helpers of the evaluation and TTS rules (evaluate.smk, tts.smk): which jobs exist, their inputs,
# outputs and GPUs. One job per (evaluation block, model) / per TTS benchmark; each `envace eval` job starts
# one server per distinct model path and runs all its (benchmark, seed) / (setting, benchmark, seed) runs.
import re

from envace.common.config import figure5_models


def eval_blocks():
    """block -> (models, benchmarks): one job per (block, model) covers all its benchmarks and seeds.
    Table 1's models and Figure 5's checkpoints also run evaluation.ours_benchmarks (OURS) in their job;
    Table 2's other models run them in an `ours` job. Blocks without models or benchmarks are left out.
    """
    ckpt = CFG["evaluation"]["checkpoints"]
    table1, table2 = (CFG["evaluation"][t] for t in ("table1", "table2"))
    # Figure 5's intermediate checkpoints; its last step is the final model, evaluated by its own block
    checkpoints = [
        m for m in figure5_models(CFG).values() if split_checkpoint(m)[1] is not None
    ]
    blocks = {
        "table1": (table1["models"], [*table1["benchmarks"], *OURS]),
        "table2": (table2["models"], table2["benchmarks"]),
        "ours": ([m for m in table2["models"] if m not in table1["models"]], OURS),
        "checkpoints": (checkpoints, [ckpt["benchmark"], *OURS]),
    }
    return {name: block for name, block in blocks.items() if block[0] and block[1]}


def eval_outputs(benchmarks, ext):
    return [
        f"{RESULTS}/eval/{{model}}/{b}/seed{s}.{ext}"
        for b in benchmarks
        for s in CFG["seeds"]
    ]


def served_gpus(models, benchmarks):
    """GPUs of one job: each served model plus each distinct user simulator / judge of its benchmarks
    (one server per model path, as `envace eval` starts them)."""
    if IS_SMOKE:
        return 0
    helpers = {
        CFG["benchmarks"][b][k]
        for b in benchmarks
        for k in ("user_simulator", "judge")
        if k in CFG["benchmarks"][b]
    }
    helper_gpus = CFG["resources"]["serve_gpus"].get("30B", 4) * len(helpers)
    return sum(model_gpus(m) for m in set(models)) + helper_gpus


def block_inputs(benchmarks):
    def inputs(wildcards):
        return {
            "specs": [eval_spec(wildcards.model, b) for b in benchmarks],
            "model": model_ready(wildcards.model),
        }

    return inputs


def block_gpus(benchmarks):
    return lambda wildcards: served_gpus([wildcards.model], benchmarks)


def eval_out_template(wildcards):
    return f"{RESULTS}/eval/{wildcards.model}/{{benchmark}}/seed{{seed}}.jsonl"


SEEDS_ARG = " ".join(str(s) for s in CFG["seeds"])


def tts_job_inputs(wildcards):
    tts = CFG["tts"]
    return {
        "specs": [tts_spec(s, wildcards.benchmark) for s in tts["settings"]],
        "actor": model_ready(tts["actor"]),
        "rehearsers": [f for m in tts["rehearsers"].values() for f in model_ready(m)],
    }


def tts_job_gpus(wildcards):
    tts = CFG["tts"]
    return served_gpus(
        [tts["actor"], *tts["rehearsers"].values()], [wildcards.benchmark]
    )


def tts_outputs(ext):
    return [
        f"{RESULTS}/tts/{s}/{{benchmark}}/seed{seed}.{ext}"
        for s in CFG["tts"]["settings"]
        for seed in CFG["tts"]["seeds"]
    ]


# ---------------------------------------------------------------- evaluation.one_job: one job, one plan
ONE_JOB = bool(CFG["evaluation"].get("one_job", False))


def model_source(model):
    """A plan item's weights keys (what `model_path_arg` passes as flags)."""
    run, step = split_checkpoint(model)
    if step is not None:
        return {"checkpoint_dir": f"{CKPT_DIR}/{run}", "step": step}
    entry = CFG["models"][model]
    if entry["kind"] == "trained":
        return {"checkpoint_dir": f"{CKPT_DIR}/{entry['run']}"}
    return {"model_path": entry["path"]}


def one_job_plan():
    """The `envace eval --plan` items of the evaluate_all job: one per model (the union of its blocks'
    benchmarks), then the TTS runs, then the rehearsal-fidelity documents (report.fidelity); ordered so
    the items of one weight folder are adjacent, each in that order, so each path is served once
    (`envace eval` keeps a server from its first item to its last)."""
    benchmarks = {}
    for block_models, block_benchmarks in eval_blocks().values():
        for m in block_models:
            have = benchmarks.setdefault(m, [])
            have += [b for b in block_benchmarks if b not in have]
    items = [
        {
            "model": m,
            **model_source(m),
            "benchmark": bs,
            "seed": list(CFG["seeds"]),
            "out": f"{RESULTS}/eval/{m}/{{benchmark}}/seed{{seed}}.jsonl",
        }
        for m, bs in benchmarks.items()
    ]
    tts = CFG["tts"]
    items.append(
        {
            "model": tts["actor"],
            **model_source(tts["actor"]),
            "benchmark": list(TTS_BENCHMARKS),
            "seed": list(tts["seeds"]),
            "out": f"{RESULTS}/tts/{{setting}}/{{benchmark}}/seed{{seed}}.jsonl",
            "tts_setting": list(tts["settings"]),
        }
    )
    if fidelity_outputs():  # after the evaluations whose trajectories they read
        items += [
            {
                "model": m,
                **model_source(m),
                "fidelity_results": eval_files(
                    FIDELITY.get("trajectories", m), b, root=RESULTS
                ),
                "out": f"{RESULTS}/fidelity/{m}/{b}.json",
            }
            for m in FIDELITY["models"]
            for b in FIDELITY["benchmarks"]
        ]
    key = lambda item: json.dumps(
        {k: item.get(k) for k in ("model_path", "checkpoint_dir", "step")}
    )
    first = {}
    for i, item in enumerate(items):
        first.setdefault(key(item), i)
    return sorted(items, key=lambda item: first[key(item)])  # stable within a path


def one_job_outputs(ext):
    """evaluate_all's result files (`jsonl`) or manifests (`manifest.json`)."""
    return [
        f"{RESULTS}/eval/{m}/{b}/seed{s}.{ext}"
        for item in one_job_plan()
        if "tts_setting" not in item and "benchmark" in item
        for m in [item["model"]]
        for b in item["benchmark"]
        for s in CFG["seeds"]
    ] + [
        f"{RESULTS}/tts/{setting}/{b}/seed{s}.{ext}"
        for setting in CFG["tts"]["settings"]
        for b in TTS_BENCHMARKS
        for s in CFG["tts"]["seeds"]
    ]


def one_job_fidelity():
    return [item["out"] for item in one_job_plan() if "fidelity_results" in item]


def one_job_inputs():
    plan = one_job_plan()
    models = [item["model"] for item in plan] + list(CFG["tts"]["rehearsers"].values())
    return {
        "specs": [
            eval_spec(item["model"], b)
            for item in plan
            if "tts_setting" not in item
            for b in item.get("benchmark", [])
        ]
        + [tts_spec(s, b) for s in CFG["tts"]["settings"] for b in TTS_BENCHMARKS]
        + [
            fidelity_spec(item["model"], Path(item["out"]).stem)
            for item in plan
            if "fidelity_results" in item
        ],
        "models": sorted({f for m in models for f in model_ready(m)}),
    }


def one_job_gpus():
    """The sum over the plan's distinct served paths: an upper bound (`envace eval` runs one item's
    servers and those kept for later items at a time)."""
    plan = one_job_plan()
    models = {item["model"] for item in plan} | set(CFG["tts"]["rehearsers"].values())
    benchmarks = {b for item in plan for b in item.get("benchmark", [])}
    return served_gpus(sorted(models), sorted(benchmarks))
