#!/usr/bin/env bash
# A one-node Slurm cluster on localhost, for CI and for trying the cluster path on a laptop.
#   scripts/slurm_localhost.sh install   # apt-get install slurm-wlm munge (Debian; needs root)
#   scripts/slurm_localhost.sh start     # write /etc/slurm/slurm.conf, start munged, slurmctld, slurmd;
#                                        # a controller this starts begins with no jobs (saved state cleared)
#   scripts/slurm_localhost.sh stop      # cancel every job, stop the daemons
# Facts this relies on (checked on Debian 12, Slurm 22.05): no systemd needed; the config must be at
# /etc/slurm/slurm.conf (job steps ignore SLURM_CONF); accounting stays off, so Snakemake's slurm
# executor must poll with `squeue` (profiles/slurm-localhost sets it).
set -euo pipefail

cmd=${1:-start}
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
HOST=$(hostname -s)
STATE=/var/spool/slurm-localhost

install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_conf() {
    mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d" /var/log/slurm /run/munge
    cat > /etc/slurm/slurm.conf <<CONF
ClusterName=envace-ci
SlurmctldHost=${HOST}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=${STATE}/ctld
SlurmdSpoolDir=${STATE}/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
KillWait=5
InactiveLimit=0
MinJobAge=300
NodeName=${HOST} CPUs=${CPUS} RealMemory=${MEM_MB} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
}

start() {
    write_conf
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged || /usr/sbin/munged --force
    if ! pgrep -x slurmctld >/dev/null; then
        # A state directory left by an earlier controller (a reused machine, a killed CI run) brings its
        # jobs back as RUNNING: the node then shows `alloc` and new jobs pend behind ghosts (seen in CI:
        # job ids from 379 on, both fault-injection jobs PENDING for 600 s). Start from nothing.
        rm -rf "${STATE:?}/ctld"/* "${STATE:?}/d"/*
        /usr/sbin/slurmctld -c
    fi
    pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
    local deadline=$((SECONDS + 90))  # sinfo itself can take ~10 s to give up on a controller
    while [ "$SECONDS" -lt "$deadline" ]; do
        if timeout 15 sinfo -h -o "%t" 2>/dev/null | grep -qE "^idle"; then
            sinfo
            return 0
        fi
        scontrol update NodeName="${HOST}" State=RESUME >/dev/null 2>&1 || true
        sleep 1
    done
    echo "slurm_localhost: the node did not become idle; node, queue and logs follow" >&2
    timeout 15 sinfo >&2 || true
    timeout 15 squeue >&2 || true
    tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
    return 1
}

stop() {
    if pgrep -x slurmctld >/dev/null; then
        scancel --quiet --user="$(id -un)" 2>/dev/null || true
        sleep 2
    fi
    local daemon
    for daemon in slurmd slurmctld munged; do  # one by one, each gone before the next (start checks pgrep)
        pkill -x "$daemon" || continue
        for _ in $(seq 1 30); do pgrep -x "$daemon" >/dev/null || break; sleep 0.5; done
        pkill -9 -x "$daemon" || true
    done
}

case "$cmd" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac
