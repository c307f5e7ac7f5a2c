#!/usr/bin/env bash
# The GPU check of the paper path, for the day a CUDA GPU is lent (one GPU, no download, < 8 min):
#   0. the node against the GPU install: NVIDIA driver vs the torch build's CUDA (13: driver >= 580),
#      verl/vLLM/torch/transformers versions; says what to do   (python -m envace.serve.gpu_stack)
#   1. build + warm-start the tiny Qwen3-architecture model in-process      (envace tiny-model)
#   2. the CM2 fixture records -> training parquet                         (envace data)
#   3. two verl main_ppo steps of the EnvACE run on the GPU                (envace train --run envace_8b)
#   4. one evaluation of that verl checkpoint through `vllm serve`         (envace eval, FinMCP fixture)
# Prints PASS/FAIL per stage and exits non-zero on the first failure; everything goes to $WORK (default
# a temp folder; logs per stage there). The config is config/smoke.yaml with gpus_per_node 1 (verl's own
# CUDA platform, no CPU overrides) and 2 steps; serving flags from its serving.vllm block, with a
# GPU-sized gpu_memory_utilization.
# Usage: scripts/gpu_check.sh [--cpu] [--dry-run]
#   --cpu      the same stages on verl's CPU platform (gpus_per_node 0): how this script is tested here
#   --dry-run  print the resolved config and the commands, run nothing
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
ENVACE=${ENVACE:-$ROOT/.venv/bin/envace}
GPUS=1
DRY=0
for a in "$@"; do
    case "$a" in
        --cpu) GPUS=0 ;;
        --dry-run) DRY=1 ;;
        *) echo "usage: $0 [--cpu] [--dry-run]" >&2; exit 2 ;;
    esac
done
WORK=${WORK:-$(mktemp -d -t envace_gpu_check.XXXXXX)}
mkdir -p "$WORK"
export PATH="$(dirname "$ENVACE"):$PATH"
SECONDS=0

"$PY" - "$WORK" "$GPUS" <<'EOF'
import json, sys, yaml
work, gpus = sys.argv[1], int(sys.argv[2])
cfg = yaml.safe_load(open("config/smoke.yaml"))
cfg["paths"] = {k: f"{work}/{k}" for k in cfg["paths"]}
model = f"{work}/tiny"
for run in cfg["training"]["runs"].values():
    run.update(base_model=model, total_steps=2, save_every=2, val_every=2, gpus_per_node=gpus)
    if run.get("simulator"):
        run["simulator"] = model
cfg["benchmarks"]["finmcp"]["limit"] = 2
cfg["evaluation"]["checkpoints"]["steps"] = [2]
if gpus:
    cfg["serving"]["vllm"]["gpu_memory_utilization"] = 0.3  # leaves room beside nothing else on the GPU
    cfg["serving"]["vllm"]["env"] = {}
json.dump(cfg, open(f"{work}/config.json", "w"), indent=1)
EOF

stage() {  # stage NAME LOG CMD...
    local name=$1 log=$2; shift 2
    if [ "$DRY" = 1 ]; then echo "[dry-run] $name: $*"; return 0; fi
    local t0=$SECONDS
    if "$@" >"$log" 2>&1; then
        echo "PASS $name ($((SECONDS - t0)) s; log $log)"
    else
        echo "FAIL $name ($((SECONDS - t0)) s); last lines of $log:"; tail -n 30 "$log"; exit 1
    fi
}

if [ "$GPUS" = 1 ]; then
    stage "node preflight (driver, CUDA build, versions)" "$WORK/preflight.log" "$PY" -m envace.serve.gpu_stack
fi
stage "tiny model (warm start)" "$WORK/tiny.log" "$ENVACE" tiny-model --out "$WORK/tiny" --config "$WORK/config.json"
stage "training data" "$WORK/data.log" "$ENVACE" data --config "$WORK/config.json" \
    --out "$WORK/data/cm2_train.parquet" --summary "$WORK/data/summary.json"
stage "verl main_ppo, 2 steps of envace_8b" "$WORK/train.log" "$ENVACE" train --config "$WORK/config.json" \
    --run envace_8b --checkpoint-dir "$WORK/ck" --done "$WORK/train_done.json"
if [ "$DRY" = 0 ]; then
    n=$(grep -c "step:[0-9]* - " "$WORK/train.log" || true)
    [ "$n" -ge 2 ] && echo "PASS verl step lines: $n" || { echo "FAIL verl step lines: $n (want 2)"; exit 1; }
fi
stage "evaluation of the verl checkpoint through vllm serve" "$WORK/eval.log" "$ENVACE" eval \
    --config "$WORK/config.json" --model envace_8b --checkpoint-dir "$WORK/ck" --benchmark finmcp --seed 0 \
    --out "$WORK/eval/finmcp_seed0.jsonl"
if [ "$DRY" = 0 ]; then
    n=$(wc -l < "$WORK/eval/finmcp_seed0.jsonl")
    [ "$n" -ge 1 ] && echo "PASS evaluation lines: $n" || { echo "FAIL evaluation wrote no line"; exit 1; }
fi
if [ "$DRY" = 1 ]; then echo "gpu_check: dry run, nothing ran (config $WORK/config.json)"; exit 0; fi
echo "gpu_check: all stages passed in $SECONDS s (work folder $WORK)"
