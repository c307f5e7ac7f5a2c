#!/usr/bin/env bash
# Start Ray across a Slurm allocation, run one driver command on the head, tear this job's Ray down on exit.
# Usage (inside sbatch): ray_slurm_launch.sh --nodes N --gpus-per-node G [--num-cpus C] [--python PY]
#                        [--dry-run] -- CMD ARGS...
# Checks before the driver starts: the allocation has N nodes (else exit 3), the head answers (else exit 4),
# and every node joins Ray with G GPUs within RAY_JOIN_TIMEOUT s (else exit 5, naming the missing nodes).
# --num-cpus: logical CPUs each node offers Ray (default $SLURM_CPUS_ON_NODE); at CPU scale envace passes
# more than the cores (verl's TaskRunner and TransferQueue actors each reserve one) and G fake GPUs.
# The driver (CMD) joins this cluster through RAY_ADDRESS, so it must not pass num_cpus/num_gpus to
# ray.init (envace.train.verl_ext.launch drops them). srun steps use --overlap: the Ray processes share the
# job's CPUs with the driver (batch step).
# Jobs sharing a node (the smoke DAG's train jobs under a one-node Slurm; several small runs per node on a
# cluster) each get their own Ray: ports from a per-job block (below), a per-job --temp-dir, and a
# teardown that ends only this job's `ray start --block` steps (never `ray stop`, which stops every Ray
# of the user on the machine).
# --dry-run prints the srun/ray commands instead of running them (used by tests with a fake scontrol).
set -euo pipefail
NODES=""; GPUS=""; NCPUS=""; DRY=0
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
# Ports: Ray's fixed defaults (GCS 6379, client server 10001, dashboard agent 52365, workers from
# 10002-19999) collide between two jobs on one node. Each job takes a block of 400 ports from its job id:
# GCS = base, client server = base+1, dashboard agent = base+2, workers base+10..base+399 (Ray picks the
# remaining ports itself). Job ids 100 apart share a block; RAY_PORT_BASE overrides it.
JOB="${SLURM_JOB_ID:-0}"
BASE="${RAY_PORT_BASE:-$(( 20000 + (JOB % 100) * 400 ))}"
PORTS=(--port="$BASE" --ray-client-server-port=$(( BASE + 1 )) --dashboard-agent-listen-port=$(( BASE + 2 ))
       --min-worker-port=$(( BASE + 10 )) --max-worker-port=$(( BASE + 399 )))  # [2:]: a worker node's
# `ray start` turns Ray's token authentication on (token in ~/.ray/auth_token, generated if missing;
# on a cluster the home folder is shared), while ray.init() and `ray status` default to no token:
# every Ray process of this job (head, workers, checks, the driver and its workers) uses token mode.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
# The job's own Ray folder (sessions, logs, ray_current_cluster); short, for Ray's unix socket paths.
RAY_TMP="${RAY_TMPDIR:-/tmp/ray_j$JOB}"
run() { if [[ $DRY -eq 1 ]]; then echo "+ $*"; else "$@"; fi; }
STEPS=()
start_step() {  # a background srun step running `ray start ... --block`; its pid is kept for teardown
  if [[ $DRY -eq 1 ]]; then echo "+ $* &"; return; fi
  "$@" & STEPS+=("$!")
}
cleanup() {
  local rc=$?
  # SIGTERM to each srun step: srun forwards it to `ray start --block`, which stops the Ray processes it
  # started (raylet, GCS, workers) and nothing else. Wait for them so the job ends with its Ray gone.
  if [[ $DRY -eq 1 ]]; then echo "+ kill -TERM <ray start steps>"; return "$rc"; fi
  (( ${#STEPS[@]} )) && echo "ray_slurm_launch: stopping job $JOB's Ray (srun reports those steps as cancelled)" >&2
  for pid in "${STEPS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${STEPS[@]}"; do wait "$pid" 2>/dev/null || true; done
  return "$rc"
}
trap cleanup EXIT
# The head's GCS address: Ray binds the node's detected address (not necessarily what the host name
# resolves to: on the CI machine "vm" is 127.0.0.1 in /etc/hosts, Ray's address 192.0.2.2) and writes it
# to <temp dir>/ray_current_cluster on the head, where this batch step runs. Wait until Ray answers there.
ADDR="$HEAD:$BASE"
wait_ray() {
  [[ $DRY -eq 1 ]] && return 0
  local deadline=$(( SECONDS + ${RAY_START_TIMEOUT:-180} ))
  until [[ -s "$RAY_TMP/ray_current_cluster" ]] && ADDR=$(<"$RAY_TMP/ray_current_cluster") \
      && [[ "$ADDR" == *":$BASE" ]] && ray status --address="$ADDR" >/dev/null 2>&1; do
    (( SECONDS < deadline )) || { echo "ray_slurm_launch: the Ray head on $HEAD did not answer" >&2; exit 4; }
    sleep 2
  done
}
run rm -f "$RAY_TMP/ray_current_cluster"  # a file left by an earlier job with this id (a requeue) is stale
start_step "${STEP[@]}" -w "$HEAD" ray start --head "${PORTS[@]}" --temp-dir="$RAY_TMP" --num-cpus="$CPUS" \
  --num-gpus="$GPUS" --include-dashboard=false --disable-usage-stats --block
wait_ray
echo "ray_slurm_launch: Ray head of job $JOB at $ADDR (temp dir $RAY_TMP)" >&2
for h in "${HOSTS[@]:1}"; do
  start_step "${STEP[@]}" -w "$h" ray start --address="$ADDR" --num-cpus="$CPUS" --num-gpus="$GPUS" \
    "${PORTS[@]:2}" --temp-dir="$RAY_TMP" --disable-usage-stats --block
done
export RAY_ADDRESS="$ADDR"
# Every node joined, with its GPUs, within RAY_JOIN_TIMEOUT seconds (default 180), else exit 5 naming the
# nodes Ray does not see (matched by host name) and the head's address they must reach.
if [[ $DRY -eq 0 ]]; then
  python - "$NODES" "$GPUS" "${RAY_JOIN_TIMEOUT:-180}" "$ADDR" "$RAY_TMP" "${HOSTS[@]}" <<'PY' || exit 5
import sys, time, ray
nodes, gpus, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
addr, tmp, hosts = sys.argv[4], sys.argv[5], sys.argv[6:]
ray.init(address="auto", logging_level="ERROR")
deadline = time.monotonic() + timeout
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    total = sum(n["Resources"].get("GPU", 0) for n in alive)
    if len(alive) >= nodes or time.monotonic() > deadline:
        break
    time.sleep(2)
ray.shutdown()
listed = ", ".join(f"{n.get('NodeManagerHostname', '?')} ({n['NodeManagerAddress']}, "
                   f"{n['Resources'].get('GPU', 0):g} GPUs)" for n in alive)
print(f"ray_slurm_launch: Ray nodes: {listed}", file=sys.stderr)
if len(alive) != nodes or total != nodes * gpus:
    seen = {n.get("NodeManagerHostname", "").split(".")[0] for n in alive}
    missing = [h for h in hosts if h.split(".")[0] not in seen] or ["(by host name: none)"]
    sys.exit(f"ray_slurm_launch: after {timeout:.0f} s Ray sees {len(alive)} of {nodes} nodes and {total:g} of "
             f"{nodes * gpus} GPUs; not joined: {', '.join(missing)}. Each node must reach the head at {addr} "
             f"(GCS port {addr.rsplit(':', 1)[1]}); their ray start output is in this job's log, Ray's logs "
             f"under {tmp}/session_latest/logs")
PY
fi
run "$@"
