# Test-time scaling by private rehearsal (Table 3, Figure 6): the actor commits once in the real
# environment after N imagined attempts by the rehearser. One job per (setting, benchmark, seed).


rule tts_evaluate:
    """Evaluate the TTS actor with one rehearsal setting (or none) on one benchmark."""
    input:
        unpack(tts_inputs),
    output:
        samples=f"{RESULTS}/tts/{{setting}}/{{benchmark}}/seed{{seed}}.jsonl",
        manifest=f"{RESULTS}/tts/{{setting}}/{{benchmark}}/seed{{seed}}.manifest.json",
    log:
        f"{RESULTS}/logs/tts/{{setting}}/{{benchmark}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/tts_evaluate/{{setting}}/{{benchmark}}/seed{{seed}}.tsv"
    conda:
        CONDA_ENV
    resources:
        gpu=tts_gpus,
    params:
        config=RESOLVED_CONFIG,
        actor=CFG["tts"]["actor"],
        actor_path=model_path_arg(CFG["tts"]["actor"]),
    shell:
        "envace eval --config {params.config} --model {params.actor} {params.actor_path} --tts-setting {wildcards.setting} "
        "--benchmark {wildcards.benchmark} --seed {wildcards.seed} --out {output.samples} > {log} 2>&1"
