#!/usr/bin/env bash
# Start Ray across a Slurm allocation, run one driver command on the head, tear Ray down on exit.
# Usage (inside sbatch): ray_slurm_launch.sh --nodes N --gpus-per-node G [--dry-run] -- CMD ARGS...
# Checks before the driver starts: the allocation has N nodes and each node reports G GPUs to Ray.
# --dry-run prints the srun/ray commands instead of running them (used by tests with a fake scontrol).
set -euo pipefail
NODES=""; GPUS=""; DRY=0; PORT="${RAY_PORT:-6379}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
    --gpus-per-node) GPUS="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --) shift; break ;;
    *) echo "ray_slurm_launch: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n "$NODES" && -n "$GPUS" && $# -gt 0 ]] || { echo "ray_slurm_launch: need --nodes, --gpus-per-node and a command" >&2; exit 2; }
[[ -n "${SLURM_JOB_NODELIST:-}" ]] || { echo "ray_slurm_launch: not inside a Slurm allocation" >&2; exit 2; }
mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
if [[ ${#HOSTS[@]} -ne $NODES ]]; then
  echo "ray_slurm_launch: allocation has ${#HOSTS[@]} nodes, run needs $NODES" >&2; exit 3
fi
CPUS="${SLURM_CPUS_ON_NODE:-8}"
HEAD="${HOSTS[0]}"
run() { if [[ $DRY -eq 1 ]]; then echo "+ $*"; else "$@"; fi; }
cleanup() { for h in "${HOSTS[@]}"; do run srun --nodes=1 --ntasks=1 -w "$h" ray stop --force || true; done; }
trap cleanup EXIT
run srun --nodes=1 --ntasks=1 -w "$HEAD" ray start --head --node-ip-address="$HEAD" --port="$PORT" \
  --num-cpus="$CPUS" --num-gpus="$GPUS" --block &
sleep "${RAY_START_WAIT:-10}"
for h in "${HOSTS[@]:1}"; do
  run srun --nodes=1 --ntasks=1 -w "$h" ray start --address="$HEAD:$PORT" --num-cpus="$CPUS" \
    --num-gpus="$GPUS" --block &
done
sleep "${RAY_START_WAIT:-10}"
export RAY_ADDRESS="$HEAD:$PORT"
if [[ $DRY -eq 0 ]]; then
  python - "$NODES" "$GPUS" <<'PY'
import sys, ray
nodes, gpus = int(sys.argv[1]), int(sys.argv[2])
ray.init(address="auto")
alive = [n for n in ray.nodes() if n["Alive"]]
total = sum(n["Resources"].get("GPU", 0) for n in alive)
ray.shutdown()
if len(alive) != nodes or total != nodes * gpus:
    sys.exit(f"ray_slurm_launch: Ray sees {len(alive)} nodes / {total} GPUs, expected {nodes} / {nodes * gpus}")
PY
fi
run "$@"
