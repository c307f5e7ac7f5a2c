# Evaluation: one job per (model, benchmark, seed); Avg@k = the seeds in config `seeds`.
# `envace eval` serves the model (vLLM on GPU, `transformers serve` on CPU), runs the benchmark and
# writes per-sample JSONL + manifest; an interrupted job resumes from its per-sample file.


rule evaluate:
    """Evaluate one model on one benchmark with one seed."""
    input:
        unpack(eval_inputs),
    output:
        samples=f"{RESULTS}/eval/{{model}}/{{benchmark}}/seed{{seed}}.jsonl",
        manifest=f"{RESULTS}/eval/{{model}}/{{benchmark}}/seed{{seed}}.manifest.json",
    log:
        f"{RESULTS}/logs/eval/{{model}}/{{benchmark}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluate/{{model}}/{{benchmark}}/seed{{seed}}.tsv"
    conda:
        CONDA_ENV
    resources:
        gpu=eval_gpus,
    params:
        config=RESOLVED_CONFIG,
        model=lambda wc: model_path_arg(wc.model),
    shell:
        "envace eval --config {params.config} --model {wildcards.model} {params.model} "
        "--benchmark {wildcards.benchmark} --seed {wildcards.seed} --out {output.samples} > {log} 2>&1"
