# Training: EnvACE (shared roles), standard GRPO, per-role policy — one job per run.
# Checkpoints live in paths.checkpoints, which Snakemake does not own: a failed or cancelled job never
# deletes them, and a re-submitted job resumes from the last one. The rule's output is a done-file.


rule train:
    """Train one run of training.runs with verl's main_ppo and our extension (GPUs on the cluster, verl's CPU platform at smoke scale)."""
    input:
        unpack(train_inputs),
    output:
        done=protected(f"{RESULTS}/train/{{run}}/done.json"),
    log:
        f"{RESULTS}/logs/train/{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{run}}.tsv"
    priority: train_priority
    conda:
        CONDA_ENV
    resources:
        nodes=train_nodes,
        gres=train_gres,
        mem_mb=train_mem_mb,
    params:
        config=RESOLVED_CONFIG,
        ckpt=lambda wc: f"{CKPT_DIR}/{wc.run}",
    shell:
        "envace train --config {params.config} --run {wildcards.run} "
        "--checkpoint-dir {params.ckpt} --done {output.done} > {log} 2>&1"
