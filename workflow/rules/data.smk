# Models and data the rest of the DAG needs: the tiny smoke model, the training parquet (CM2-layout
# records) and, where the config names them, the ledger's records (our benchmark's reference dialogues).


rule build_tiny_model:
    """Smoke scale: build the tiny Qwen3-architecture model and tokenizer in-process (no download), then
    warm-start it by SFT stages on reference records so its tool calls parse (config tiny_model.warmstart).
    """
    input:
        data=tiny_model_data(),
    output:
        done=f"{TINY_MODEL}/done.json",
    log:
        f"{RESULTS}/logs/build_tiny_model.log",
    benchmark:
        f"{RESULTS}/benchmarks/build_tiny_model.tsv"
    conda:
        CONDA_ENV
    params:
        outdir=lambda wc, output: os.path.dirname(output.done),
        warmstart=tiny_model_args(),
    shell:
        "envace tiny-model --out {params.outdir} --done {output.done} {params.warmstart} > {log} 2>&1"


rule ledger_records:
    """The ledger's reference records of one split (benchmarks.ledger), CM2's layout: a warm-start stage's
    data or training.data.source may name them (ledger_records_file)."""
    input:
        spec=lambda wc: ledger_spec(wc.split),
    output:
        records=ledger_records_file("{split}"),
    log:
        f"{RESULTS}/logs/ledger_records_{{split}}.log",
    wildcard_constraints:
        split="|".join(LEDGER_SPLITS),
    conda:
        CONDA_ENV
    params:
        config=RESOLVED_CONFIG,
    shell:
        "envace ledger-records --config {params.config} --split {wildcards.split} "
        "--out {output.records} > {log} 2>&1"


rule prepare_training_data:
    """CM2 records -> the parquet verl reads (tools, reference pairs, checklists); bad records reported."""
    input:
        source=training_source_input(),
    output:
        parquet=f"{DATA_DIR}/cm2_train.parquet",
        val=f"{DATA_DIR}/cm2_val.parquet",
        summary=f"{DATA_DIR}/cm2_summary.json",
    log:
        f"{RESULTS}/logs/prepare_training_data.log",
    benchmark:
        f"{RESULTS}/benchmarks/prepare_training_data.tsv"
    conda:
        CONDA_ENV
    params:
        config=RESOLVED_CONFIG,
    shell:
        "envace data --config {params.config} --out {output.parquet} --val-out {output.val} "
        "--summary {output.summary} > {log} 2>&1"
