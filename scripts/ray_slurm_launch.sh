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
STEP=(srun --overlap --nodes=1 --ntasks=1)
# `ray start` turns Ray's token authentication on (token in ~/.ray/auth_token, generated if missing;
# on a cluster the home folder is shared), while ray.init() and `ray status` default to no token:
# every Ray process of this job (head, workers, checks, the driver and its workers) uses token mode.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
RAY_TMP="${RAY_TMPDIR:-/tmp/ray}"
run() { if [[ $DRY -eq 1 ]]; then echo "+ $*"; else "$@"; fi; }
cleanup() { for h in "${HOSTS[@]}"; do run "${STEP[@]}" -w "$h" ray stop --force || true; done; }
trap cleanup EXIT
# The head's GCS address: Ray binds the node's detected address (not necessarily what the host name
# resolves to: on the CI machine "vm" is 127.0.0.1 in /etc/hosts, Ray's address 192.0.2.2) and writes it
# to <ray tmp>/ray_current_cluster on the head, where this batch step runs. Wait until Ray answers there.
ADDR="$HEAD:$PORT"
wait_ray() {
  [[ $DRY -eq 1 ]] && return 0
  local deadline=$(( SECONDS + ${RAY_START_TIMEOUT:-180} ))
  until [[ -s "$RAY_TMP/ray_current_cluster" ]] && ADDR=$(<"$RAY_TMP/ray_current_cluster") \
      && [[ "$ADDR" == *":$PORT" ]] && ray status --address="$ADDR" >/dev/null 2>&1; do
    (( SECONDS < deadline )) || { echo "ray_slurm_launch: the Ray head on $HEAD did not answer" >&2; exit 4; }
    sleep 2
  done
}
run "${STEP[@]}" -w "$HEAD" ray start --head --port="$PORT" --num-cpus="$CPUS" --num-gpus="$GPUS" \
  --include-dashboard=false --disable-usage-stats --block &
wait_ray
for h in "${HOSTS[@]:1}"; do
  run "${STEP[@]}" -w "$h" ray start --address="$ADDR" --num-cpus="$CPUS" --num-gpus="$GPUS" \
    --disable-usage-stats --block &
done
(( ${#HOSTS[@]} > 1 )) && sleep "${RAY_START_WAIT:-10}"
export RAY_ADDRESS="$ADDR"
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
