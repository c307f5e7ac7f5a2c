# Reporting: per-sample results -> bootstrap intervals -> Tables 1-3, Figures 3-6, the paper diff.
# Each table and figure is its own target and depends only on the evaluations it shows.
# These steps take about a second each (no model, no GPU): they run in Snakemake's own process, never
# through the cluster's queue (a Slurm round trip costs each of them more than the work; measured on the
# CI's one-node Slurm: ~2.5 min of the smoke DAG for 25 such jobs).


localrules:
    summary,
    table,
    figure,
    figure6,
    paper_diff,
    fidelity_report,
    report_html,


rule summary:
    """Avg@k with a two-level bootstrap interval for one (model, benchmark)."""
    input:
        lambda wc: eval_files(wc.model, wc.benchmark),
    output:
        f"{RESULTS}/summary/{{model}}/{{benchmark}}.json",
    log:
        f"{RESULTS}/logs/summary/{{model}}/{{benchmark}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/summary/{{model}}/{{benchmark}}.tsv"
    conda:
        CONDA_ENV
    params:
        config=RESOLVED_CONFIG,
        source=lambda wc, input: REPORT_SOURCE,
    shell:
        "envace aggregate --config {params.config} --results-dir {params.source} "
        "--model {wildcards.model} --benchmark {wildcards.benchmark} --out {output} > {log} 2>&1"


rule table:
    """One of Tables 1-3 as CSV, Markdown and LaTeX, ours with CI beside the paper's value."""
    input:
        lambda wc: table_inputs(wc.table),
    output:
        md=f"{RESULTS}/tables/{{table}}.md",
        csv=f"{RESULTS}/tables/{{table}}.csv",
        tex=f"{RESULTS}/tables/{{table}}.tex",
    log:
        f"{RESULTS}/logs/tables/{{table}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/table/{{table}}.tsv"
    wildcard_constraints:
        table="table[123]",
    conda:
        CONDA_ENV
    params:
        config=RESOLVED_CONFIG,
        source=lambda wc, input: REPORT_SOURCE,
        outdir=lambda wc, output: os.path.dirname(output.md),
    shell:
        "envace tables {wildcards.table} --config {params.config} --results-dir {params.source} "
        "--out-dir {params.outdir} > {log} 2>&1"


rule figure:
    """One of Figures 3-6 (PDF and PNG): our values with error bars, the paper's as markers."""
    input:
        figure_rule_inputs,
    output:
        pdf=f"{FIGURES}/{{name}}.pdf",
        png=f"{FIGURES}/{{name}}.png",
    log:
        f"{RESULTS}/logs/figures/{{name}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/figure/{{name}}.tsv"
    wildcard_constraints:
        name="|".join(n for f, n in FIGURE_NAMES.items() if f != "fig6"),
    conda:
        CONDA_ENV
    params:
        config=RESOLVED_CONFIG,
        source=lambda wc, input: REPORT_SOURCE,
        fig=lambda wc: wc.name.split("_")[0],
    shell:
        "envace figures {params.fig} --config {params.config} --results-dir {params.source} "
        "--out {output.pdf} > {log} 2>&1"


rule figure6:
    """Figure 6 (TTS score vs N) with the final-execution context length per N, and those lengths as CSV."""
    input:
        figure_inputs("fig6"),
    output:
        pdf=f"{FIGURES}/{FIGURE_NAMES['fig6']}.pdf",
        png=f"{FIGURES}/{FIGURE_NAMES['fig6']}.png",
        context=f"{FIGURES}/{FIGURE_NAMES['fig6']}_context.csv",
    log:
        f"{RESULTS}/logs/figures/{FIGURE_NAMES['fig6']}.log",
    benchmark:
        f"{RESULTS}/benchmarks/figure/fig6.tsv"
    conda:
        CONDA_ENV
    params:
        config=RESOLVED_CONFIG,
        source=lambda wc, input: REPORT_SOURCE,
    shell:
        "envace figures fig6 --config {params.config} --results-dir {params.source} "
        "--out {output.pdf} > {log} 2>&1"


rule paper_diff:
    """Every paper cell and claim against ours: EXACT / WITHIN_CI / OUTSIDE_CI / MISSING."""
    input:
        tables=[f"{RESULTS}/tables/{t}.md" for t in TABLES],
        figures=[f"{FIGURES}/{name}.pdf" for name in FIGURE_NAMES.values()],
        released=released_inputs(),
        learning=learning_files(),
    output:
        md=f"{RESULTS}/paper_diff.md",
        json=f"{RESULTS}/paper_diff.json",
    log:
        f"{RESULTS}/logs/paper_diff.log",
    benchmark:
        f"{RESULTS}/benchmarks/paper_diff.tsv"
    conda:
        CONDA_ENV
    params:
        config=RESOLVED_CONFIG,
        source=lambda wc, input: REPORT_SOURCE,
    shell:
        "envace diff --config {params.config} --results-dir {params.source} "
        "--out-md {output.md} --out-json {output.json} > {log} 2>&1"


if released_models(
    CFG
):  # config `released`: the authors' released weights through our evaluators

    localrules:
        released,
        released_diff,

    rule released:
        """The authors' released weights through our evaluators (config `released`): their evaluations,
        TTS suite and fidelity, and the diff against the paper; no training job."""
        input:
            released_inputs(),
            f"{RESULTS}/released_diff.md",

    rule released_diff:
        """The released weights' cells and claims against the paper (envace diff --released-only)."""
        input:
            released_inputs(),
        output:
            md=f"{RESULTS}/released_diff.md",
            json=f"{RESULTS}/released_diff.json",
        log:
            f"{RESULTS}/logs/released_diff.log",
        benchmark:
            f"{RESULTS}/benchmarks/released_diff.tsv"
        conda:
            CONDA_ENV
        params:
            config=RESOLVED_CONFIG,
            source=lambda wc, input: REPORT_SOURCE,
        shell:
            "envace diff --released-only --config {params.config} --results-dir {params.source} "
            "--out-md {output.md} --out-json {output.json} > {log} 2>&1"


rule report_html:
    """The reproduction report: one self-contained HTML page (the verdict: claims,
    cell statuses, the learning check; figures, tables, fidelity, every paper cell,
    provenance)."""
    input:
        **report_html_inputs(),
    output:
        f"{RESULTS}/report.html",
    log:
        f"{RESULTS}/logs/report_html.log",
    benchmark:
        f"{RESULTS}/benchmarks/report_html.tsv"
    conda:
        CONDA_ENV
    params:
        train_dir=f"{RESULTS}/train",
    shell:
        "envace report-html --tables {input.tables} --figures {input.figures} "
        "--diff-json {input.diff_json} --train-dir {params.train_dir} "
        "--out {output} > {log} 2>&1"


if not ONE_JOB:  # else rule evaluate_all writes them (evaluate.smk)

    rule fidelity:
        """Rehearsal fidelity of one model on its own real trajectories of one benchmark (our extension)."""
        input:
            results=lambda wc: eval_files(wc.model, wc.benchmark, root=RESULTS),
            spec=lambda wc: fidelity_spec(wc.model, wc.benchmark),
        output:
            f"{RESULTS}/fidelity/{{model}}/{{benchmark}}.json",
        log:
            f"{RESULTS}/logs/fidelity/{{model}}/{{benchmark}}.log",
        benchmark:
            f"{RESULTS}/benchmarks/fidelity/{{model}}/{{benchmark}}.tsv"
        conda:
            CONDA_ENV
        resources:
            gpu=lambda wc: model_gpus(wc.model),
        params:
            config=RESOLVED_CONFIG,
            model=lambda wc: model_path_arg(wc.model),
        shell:
            "envace fidelity --config {params.config} --results {input.results} {params.model} "
            "--label {wildcards.model} --out {output} > {log} 2>&1"


rule fidelity_report:
    """Fidelity table and figure with bootstrap intervals, per model, benchmark and tool."""
    input:
        fidelity_inputs(),
    output:
        md=f"{RESULTS}/tables/fidelity.md",
        csv=f"{RESULTS}/tables/fidelity.csv",
        pdf=f"{FIGURES}/fidelity.pdf",
    log:
        f"{RESULTS}/logs/fidelity/report.log",
    benchmark:
        f"{RESULTS}/benchmarks/fidelity_report.tsv"
    conda:
        CONDA_ENV
    params:
        contrasts=" ".join(
            f"--contrast {a}:{b}"
            for a, b in CFG["report"].get("fidelity", {}).get("contrasts", [])
        ),
    shell:
        "envace fidelity-report --inputs {input} --table {output.md} --csv {output.csv} "
        "--figure {output.pdf} {params.contrasts} > {log} 2>&1"
