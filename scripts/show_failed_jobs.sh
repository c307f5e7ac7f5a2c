#!/usr/bin/env bash
# Print what a failed Snakemake run needs for a diagnosis, at the end of the output (CI keeps only the
# tail): each "Error in rule" block of the latest Snakemake log, then the last lines of every log file
# those blocks name (the rule's own `log:` and, under Slurm, the job's sbatch log).
# Usage: scripts/show_failed_jobs.sh [lines per log, default 60]
set -uo pipefail
n="${1:-60}"
log=$(ls -t .snakemake/log/*.snakemake.log 2>/dev/null | head -1)
[ -n "$log" ] || { echo "[show_failed_jobs] no Snakemake log under .snakemake/log"; exit 0; }
echo "== failed jobs in $log"
# an error block runs from "Error in rule" to the next blank line
blocks=$(awk '/^Error in rule/ {on=1} on {print} on && /^[[:space:]]*$/ {on=0}' "$log")
echo "$blocks"
for f in $(echo "$blocks" | grep -E '^[[:space:]]*log:' | sed -e 's/^[[:space:]]*log://' -e 's/(check log.*//' | tr ',' ' '); do
    [ -f "$f" ] || continue
    echo "== last $n lines of $f"
    tail -n "$n" "$f"
done
