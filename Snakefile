# envace — the EnvACE paper as one Snakemake workflow.
#   snakemake --profile slurm all                      # the paper on a Slurm GPU cluster
#   snakemake --profile profiles/local --configfile config/smoke.yaml all   # CPU smoke scale
#   snakemake -n figures/fig3_ablation.pdf             # plan one figure and only its ancestors
from snakemake.utils import min_version, validate

min_version("9.0")


# The paper config is the default; `--configfile config/smoke.yaml` replaces it (not merged into it:
# Snakemake would otherwise deep-merge the two matrices).
if "scale" not in config:

    configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/tts.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        all_report_outputs(),
