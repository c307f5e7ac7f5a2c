#!/usr/bin/env bash
# Start Ray across a Slurm allocation, run one driver command on the head, tear Ray down on exit.
# Usage (inside sbatch): ray_slurm_launch.sh --nodes N --gpus-per-node G [--num-cpus C] [--python PY]
#                        [--dry-run] -- CMD ARGS...
# Checks before the driver starts: the allocation has N nodes and each node reports G GPUs to Ray.
# --num-cpus: logical CPUs each node offers Ray (default $SLURM_CPUS_ON_NODE); at CPU scale envace passes
# more than the cores (verl's TaskRunner and TransferQueue actors each reserve one) and G fake GPUs.
# The driver (CMD) joins this cluster through RAY_ADDRESS, so it must not pass num_cpus/num_gpus to
# ray.init (envace.verl_ext.launch drops them). srun steps use --overlap: the Ray processes share the
# job's CPUs with the driver (batch step).
# --dry-run prints the srun/ray commands instead of running them (used by tests with a fake scontrol).
set -euo pipefail
NODES=""; GPUS=""; NCPUS=""; DRY=0; PORT="${RAY_PORT:-6379}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
    --gpus-per-node) GPUS="$2"; shift 2 ;;
    --num-cpus) NCPUS="$2"; shift 2 ;;
    --python) PATH="$(dirname "$2"):$PATH"; shift 2 ;;   # the driver's interpreter: its ray and python
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
CPUS="${NCPUS:-${SLURM_CPUS_ON_NODE:-8}}"
HEAD="${HOSTS[0]}"
# Ray wants an address, not a host name; a name that does not resolve (tests' fake nodes) is kept
HEAD_IP=$(getent ahostsv4 "$HEAD" 2>/dev/null | awk 'NR == 1 {print $1}' || true)
HEAD_IP="${HEAD_IP:-$HEAD}"
STEP=(srun --overlap --nodes=1 --ntasks=1)
run() { if [[ $DRY -eq 1 ]]; then echo "+ $*"; else "$@"; fi; }
cleanup() { for h in "${HOSTS[@]}"; do run "${STEP[@]}" -w "$h" ray stop --force || true; done; }
trap cleanup EXIT
# wait until Ray answers at the head (or RAY_START_TIMEOUT seconds pass)
wait_ray() {
  [[ $DRY -eq 1 ]] && return 0
  local deadline=$(( SECONDS + ${RAY_START_TIMEOUT:-180} ))
  until ray status --address="$HEAD_IP:$PORT" >/dev/null 2>&1; do
    (( SECONDS < deadline )) || { echo "ray_slurm_launch: Ray did not answer at $HEAD_IP:$PORT" >&2; exit 4; }
    sleep 2
  done
}
run "${STEP[@]}" -w "$HEAD" ray start --head --node-ip-address="$HEAD_IP" --port="$PORT" \
  --num-cpus="$CPUS" --num-gpus="$GPUS" --include-dashboard=false --block &
wait_ray
for h in "${HOSTS[@]:1}"; do
  run "${STEP[@]}" -w "$h" ray start --address="$HEAD_IP:$PORT" --num-cpus="$CPUS" \
    --num-gpus="$GPUS" --block &
done
(( ${#HOSTS[@]} > 1 )) && sleep "${RAY_START_WAIT:-10}"
export RAY_ADDRESS="$HEAD_IP:$PORT"
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
