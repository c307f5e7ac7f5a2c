#!/usr/bin/env bash
# A Slurm cluster on localhost, for CI and for trying the cluster path on a laptop.
#   scripts/slurm_localhost.sh install   # apt-get install slurm-wlm munge (Debian; needs root)
#   scripts/slurm_localhost.sh start     # write /etc/slurm/slurm.conf, start munged, slurmctld, slurmd;
#                                        # a controller this starts begins with no jobs (saved state cleared)
#   scripts/slurm_localhost.sh start --nodes 2
#                                        # also two more nodes, envace-n1 and envace-n2 (partition "two"),
#                                        # each a slurmd in its own network and host-name namespace
#   scripts/slurm_localhost.sh stop      # cancel every job, stop the daemons, remove the two nodes' network
# The two nodes: network namespaces envace-n1/envace-n2 (ip netns), each with a veth into the bridge
# envace-br0 (10.199.0.254/24 on this machine; the nodes 10.199.0.1 and .2, their default route via the
# bridge, nothing outside this machine addressed), its own host name (unshare --uts) that /etc/hosts
# resolves to its address (lines marked "# slurm_localhost"), its own /tmp (a tmpfs in its own mount
# namespace: Ray's session folders, verl's weight-sync sockets stay on their node, as on two hosts) and its
# own slurmd (-N envace-nK; spool, pid and log files per node name). The controller listens on the
# bridge's address. Everything else of the file system is shared (a job's inputs and checkpoints must
# live outside /tmp, as on a cluster's shared file system), and so are the CPUs.
# Facts this relies on (checked on Debian 12, Slurm 22.05): no systemd needed; the config must be at
# /etc/slurm/slurm.conf (job steps ignore SLURM_CONF); accounting stays off, so Snakemake's slurm
# executor must poll with `squeue` (profiles/slurm-localhost sets it).
set -euo pipefail

cmd=${1:-start}
NODES=1
if [[ "${2:-}" == "--nodes" ]]; then NODES=${3:?--nodes needs a value}; fi
[[ "$NODES" == 1 || "$NODES" == 2 ]] || { echo "slurm_localhost: --nodes must be 1 or 2" >&2; exit 2; }
BRIDGE=envace-br0
NET=10.199.0
MARK="# slurm_localhost"
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
    mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d/${HOST}" "$STATE/d/envace-n1" "$STATE/d/envace-n2" \
        /var/log/slurm /run/munge
    local ctld="${HOST}" two=""
    if [[ "$NODES" == 2 ]]; then  # the namespaced nodes reach the controller at the bridge's address
        ctld="${HOST}(${NET}.254)"
        two="NodeName=envace-n[1-2] NodeAddr=${NET}.[1-2] CPUs=${CPUS} RealMemory=${MEM_MB} State=UNKNOWN
PartitionName=two Nodes=envace-n[1-2] MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
    fi
    cat > /etc/slurm/slurm.conf <<CONF
ClusterName=envace-ci
SlurmctldHost=${ctld}
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
SlurmdSpoolDir=${STATE}/d/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
KillWait=5
InactiveLimit=0
MinJobAge=300
NodeName=${HOST} CPUs=${CPUS} RealMemory=${MEM_MB} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
${two}
CONF
}

net_up() {  # the bridge, and per node a namespace with its veth, address, route and /etc/hosts line
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr replace "${NET}.254/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local i
    for i in 1 2; do
        ip netns list | grep -qw "envace-n$i" && ip netns del "envace-n$i"
        ip link del "envace-v$i" 2>/dev/null || true
        ip netns add "envace-n$i"
        ip link add "envace-v$i" type veth peer name eth0 netns "envace-n$i"
        ip link set "envace-v$i" master "$BRIDGE" up
        ip netns exec "envace-n$i" ip addr add "${NET}.$i/24" dev eth0
        ip netns exec "envace-n$i" ip link set eth0 up
        ip netns exec "envace-n$i" ip link set lo up
        ip netns exec "envace-n$i" ip route add default via "${NET}.254"
        grep -q "envace-n$i $MARK" /etc/hosts || echo "${NET}.$i envace-n$i $MARK" >> /etc/hosts
    done
}

net_down() {
    local i
    for i in 1 2; do
        ip netns list 2>/dev/null | grep -qw "envace-n$i" && ip netns del "envace-n$i"
        ip link del "envace-v$i" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    if grep -q "$MARK" /etc/hosts; then  # /etc/hosts may be a bind mount: rewrite it in place
        grep -v "$MARK" /etc/hosts > /etc/hosts.slurm_localhost && cat /etc/hosts.slurm_localhost > /etc/hosts
        rm -f /etc/hosts.slurm_localhost
    fi
}

wait_idle() {  # $1: a node name; until sinfo shows it idle (90 s), else the node, queue and logs, exit 1
    local deadline=$((SECONDS + 90))  # sinfo itself can take ~10 s to give up on a controller
    while [ "$SECONDS" -lt "$deadline" ]; do
        if timeout 15 sinfo -h -n "$1" -o "%t" 2>/dev/null | grep -qE "^idle"; then
            return 0
        fi
        scontrol update NodeName="$1" State=RESUME >/dev/null 2>&1 || true
        sleep 1
    done
    echo "slurm_localhost: node $1 did not become idle; node, queue and logs follow" >&2
    timeout 15 sinfo >&2 || true
    timeout 15 squeue >&2 || true
    tail -n 20 /var/log/slurm/slurmctld.log "/var/log/slurm/slurmd-$1.log" >&2 || true
    return 1
}

start() {
    if [[ "$NODES" == 2 ]] && pgrep -x slurmctld >/dev/null \
            && ! timeout 15 scontrol show node envace-n1 >/dev/null 2>&1; then
        echo "slurm_localhost: the running controller has one node; restarting it with two more" >&2
        stop
    fi
    [[ "$NODES" == 2 ]] && net_up
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
        mkdir -p "$STATE/d/${HOST}" "$STATE/d/envace-n1" "$STATE/d/envace-n2"  # SlurmdSpoolDir .../d/%n
        /usr/sbin/slurmctld -c
    fi
    pgrep -f "slurmd -N ${HOST}\$" >/dev/null || /usr/sbin/slurmd -N "${HOST}"
    wait_idle "${HOST}"
    if [[ "$NODES" == 2 ]]; then
        local i
        for i in 1 2; do
            # nsenter, not `ip netns exec`: that one remounts /sys, without the cgroup file systems
            # slurmd's cgroup plugin needs at start
            pgrep -f "slurmd -N envace-n$i\$" >/dev/null || nsenter --net="/run/netns/envace-n$i" \
                unshare --uts --mount sh -c "mount -t tmpfs -o mode=1777 tmpfs /tmp && hostname envace-n$i \
                    && exec /usr/sbin/slurmd -N envace-n$i" \
                || { tail -n 20 "/var/log/slurm/slurmd-envace-n$i.log" >&2; exit 1; }
            wait_idle "envace-n$i"
        done
    fi
    sinfo
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
    net_down
}

case "$cmd" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac
