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
