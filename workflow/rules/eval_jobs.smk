# Helpers of the evaluation and TTS rules (evaluate.smk, tts.smk): which jobs exist, their inputs,
# outputs and GPUs. One job per (evaluation block, model) / per TTS benchmark; each `envace eval` job starts
# one server per distinct model path and runs all its (benchmark, seed) / (setting, benchmark, seed) runs.
import re

from envace.common.config import (
    eval_seeds,
    evaluation_pairs,
    figure5_models,
    released_models,
    tts_models,
)


def eval_blocks():
    """block -> (models, benchmarks): one job per (block, model) covers all its benchmarks and seeds.
    Table 1's models and Figure 5's checkpoints also run evaluation.ours_benchmarks (OURS) in their job;
    Table 2's other models run them in an `ours` job; each released checkpoint (config `released`) runs
    its counterpart's benchmarks in a `released_<model>` job. Blocks without models or benchmarks are
    left out.
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
    pairs = evaluation_pairs(CFG)
    for rel in released_models(CFG).values():
        blocks[f"released_{rel}"] = ([rel], [b for m, b in pairs if m == rel])
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


# The TTS suites: the paper's ("", tts.settings) and, with a released checkpoint of tts.actor, the
# released weights' ("released", tts.released_settings): (actor, rehearser models, setting ids) each.
TTS_SUITES = {
    suite: (*tts_models(CFG, ids[0]), ids)
    for suite, ids in (
        ("", CFG["tts"]["settings"]),
        ("released", CFG["tts"]["released_settings"]),
    )
    if ids
}


def tts_job_inputs(suite):
    actor, rehearsers, settings = TTS_SUITES[suite]

    def inputs(wildcards):
        return {
            "specs": [tts_spec(s, wildcards.benchmark) for s in settings],
            "actor": model_ready(actor),
            "rehearsers": [f for m in rehearsers.values() for f in model_ready(m)],
        }

    return inputs


def tts_job_gpus(suite):
    actor, rehearsers, _ = TTS_SUITES[suite]
    return lambda wildcards: served_gpus(
        [actor, *rehearsers.values()], [wildcards.benchmark]
    )


def tts_outputs(ext, suite=""):
    return [
        f"{RESULTS}/tts/{s}/{{benchmark}}/seed{seed}.{ext}"
        for s in TTS_SUITES[suite][2]
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


def one_job_plan(part="main"):
    """The `envace eval --plan` items of a one-job evaluation: one per model (the union of its blocks'
    benchmarks), then the TTS runs, then the rehearsal-fidelity documents (report.fidelity); ordered so
    the items of one weight folder are adjacent, each in that order, so each path is served once
    (`envace eval` keeps a server from its first item to its last). `part`: "main" (evaluate_all) or
    "released" (evaluate_released: the released checkpoints' items, so target `released` trains nothing).
    """
    benchmarks = {}
    for block_models, block_benchmarks in eval_blocks().values():
        for m in block_models:
            have = benchmarks.setdefault(m, [])
            have += [b for b in block_benchmarks if b not in have]
    # one item per (model, seeds): the learning check's models run our benchmarks with its seeds too
    by_seeds = {}
    for m, bs in benchmarks.items():
        for b in bs:
            by_seeds.setdefault((m, tuple(eval_seeds(CFG, m, b))), []).append(b)
    items = [
        {
            "model": m,
            **model_source(m),
            "benchmark": bs,
            "seed": list(seeds),
            "out": f"{RESULTS}/eval/{m}/{{benchmark}}/seed{{seed}}.jsonl",
        }
        for (m, seeds), bs in by_seeds.items()
    ]
    items += [
        {
            "model": actor,
            **model_source(actor),
            "benchmark": list(TTS_BENCHMARKS),
            "seed": list(CFG["tts"]["seeds"]),
            "out": f"{RESULTS}/tts/{{setting}}/{{benchmark}}/seed{{seed}}.jsonl",
            "tts_setting": list(settings),
        }
        for actor, _, settings in TTS_SUITES.values()
    ]
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
            for m in fidelity_models()
            for b in FIDELITY["benchmarks"]
        ]
    released = set(released_models(CFG).values())
    items = [i for i in items if (i["model"] in released) == (part == "released")]
    key = lambda item: json.dumps(
        {k: item.get(k) for k in ("model_path", "checkpoint_dir", "step")}
    )
    first = {}
    for i, item in enumerate(items):
        first.setdefault(key(item), i)
    return sorted(items, key=lambda item: first[key(item)])  # stable within a path


def one_job_outputs(ext, part="main"):
    """A one-job evaluation's result files (`jsonl`) or manifests (`manifest.json`)."""
    plan = one_job_plan(part)
    return [
        f"{RESULTS}/eval/{item['model']}/{b}/seed{s}.{ext}"
        for item in plan
        if "tts_setting" not in item and "benchmark" in item
        for b in item["benchmark"]
        for s in item["seed"]
    ] + [
        f"{RESULTS}/tts/{setting}/{b}/seed{s}.{ext}"
        for item in plan
        if "tts_setting" in item
        for setting in item["tts_setting"]
        for b in item["benchmark"]
        for s in item["seed"]
    ]


def one_job_fidelity(part="main"):
    return [item["out"] for item in one_job_plan(part) if "fidelity_results" in item]


def _item_rehearsers(item):
    """The rehearser models of a TTS plan item's suite."""
    if "tts_setting" not in item:
        return []
    return list(tts_models(CFG, item["tts_setting"][0])[1].values())


def one_job_inputs(part="main"):
    plan = one_job_plan(part)
    models = [item["model"] for item in plan] + [
        m for item in plan for m in _item_rehearsers(item)
    ]
    return {
        "specs": [
            eval_spec(item["model"], b)
            for item in plan
            if "tts_setting" not in item
            for b in item.get("benchmark", [])
        ]
        + [
            tts_spec(s, b)
            for item in plan
            if "tts_setting" in item
            for s in item["tts_setting"]
            for b in item["benchmark"]
        ]
        + [
            fidelity_spec(item["model"], Path(item["out"]).stem)
            for item in plan
            if "fidelity_results" in item
        ],
        "models": sorted({f for m in models for f in model_ready(m)}),
    }


def one_job_gpus(part="main"):
    """The sum over the plan's distinct served paths: an upper bound (`envace eval` runs one item's
    servers and those kept for later items at a time)."""
    plan = one_job_plan(part)
    models = {item["model"] for item in plan} | {
        m for item in plan for m in _item_rehearsers(item)
    }
    benchmarks = {b for item in plan for b in item.get("benchmark", [])}
    return served_gpus(sorted(models), sorted(benchmarks))
