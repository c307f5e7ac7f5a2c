# Test-time scaling by private rehearsal (Table 3, Figure 6): the actor commits once in the real
# environment after N imagined attempts by the rehearser. One job per benchmark runs every setting and
# seed, starting each model server once (actor, the base rehearser, the user simulator; a rehearser that
# is the actor reuses its server); one per-sample JSONL + manifest per (setting, benchmark, seed).
# With evaluation.one_job the TTS runs are part of rule evaluate_all instead.


if not ONE_JOB:  # else rule evaluate_all runs the TTS settings (evaluate.smk)

    # one rule per TTS suite: tts_evaluate (the paper's) and, with a released checkpoint of the actor,
    # tts_evaluate_released (the released weights as actor and EnvACE rehearser)
    for suite, (suite_actor, _, suite_settings) in TTS_SUITES.items():

        rule:
            """Evaluate the TTS actor with every rehearsal setting (and none) on one benchmark."""
            name:
                "tts_evaluate" + (f"_{suite}" if suite else "")
            input:
                unpack(tts_job_inputs(suite)),
            output:
                samples=tts_outputs("jsonl", suite),
                manifests=tts_outputs("manifest.json", suite),
            log:
                f"{RESULTS}/logs/tts/{suite or 'paper'}/{{benchmark}}.log",
            benchmark:
                f"{RESULTS}/benchmarks/tts_evaluate/{suite or 'paper'}/{{benchmark}}.tsv"
            conda:
                CONDA_ENV
            resources:
                gpu=tts_job_gpus(suite),
            params:
                config=RESOLVED_CONFIG,
                actor=suite_actor,
                actor_path=model_path_arg(suite_actor),
                settings=" ".join(suite_settings),
                seeds=" ".join(str(s) for s in CFG["tts"]["seeds"]),
                out=lambda wc: f"{RESULTS}/tts/{{setting}}/{wc.benchmark}/seed{{seed}}.jsonl",
            shell:
                "envace eval --config {params.config} --model {params.actor} {params.actor_path} "
                "--tts-setting {params.settings} --benchmark {wildcards.benchmark} --seed {params.seeds} "
                "--out '{params.out}' > {log} 2>&1"
