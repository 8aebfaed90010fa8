#!/usr/bin/env bash
# A real one-node Slurm on this machine for the Slurm tests (needs root and Debian's slurmctld,
# slurmd and munge).
#
#   slurm.sh up     start munged, slurmctld and slurmd; wait until the node is idle
#   slurm.sh down   stop everything `up` started and remove the state (safe at any time,
#                   repeatedly, also after a failed `up`)
#   slurm.sh env    print the variables a test exports (SLURM_CONF)
#
# Nothing system-wide is touched: the munge key (made for the test), munged's socket, the
# slurm.conf and every pid, log, state and spool file live in the state directory
# (TUTTI_SLURM_DIR, default /tmp/tutti-slurm). The daemons listen on ports of their own
# (TUTTI_SLURM_PORT and the next one, default 16817) so a system Slurm is not disturbed.
# The node is this host, with CPUs=8 whatever the machine has (SlurmdParameters=
# config_overrides), so 4 tasks fit on 2 cores; no cgroups (proctrack/linuxproc, task/none).
set -euo pipefail

STATE=${TUTTI_SLURM_DIR:-/tmp/tutti-slurm}
PORT=${TUTTI_SLURM_PORT:-16817}
SBIN=/usr/sbin

die() { echo "slurm.sh: $*" >&2; exit 1; }

# Stops the daemons whose pids are in the files named: SIGTERM to all, SIGKILL to those
# still there after 5 s.
stop_pidfiles() {
  local pids=() pid file
  for file in "$@"; do
    [ -e "$file" ] || continue
    pid=$(cat "$file" 2>/dev/null || true)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 1 ] || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

down() {
  [ -d "$STATE" ] || return 0
  # Job steps first (slurmstepd and their tasks), while slurmd can still reap them.
  if [ -e "$STATE/slurm.conf" ] && [ -e "$STATE/slurmctld.pid" ]; then
    SLURM_CONF="$STATE/slurm.conf" timeout 10 scancel --full --quiet \
      "--user=$(id -un)" 2>/dev/null || true
  fi
  stop_pidfiles "$STATE/slurmd.pid" "$STATE/slurmctld.pid"
  # slurmstepd processes left behind, with their tasks: only those of this Slurm (their
  # environment names its slurm.conf).
  local steps=() pid
  for pid in $(pgrep -x slurmstepd 2>/dev/null || true); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null \
         | grep -qx "SLURM_CONF=$STATE/slurm.conf"; then
      steps+=("$pid")
    fi
  done
  if [ "${#steps[@]}" -gt 0 ]; then
    local victims=("${steps[@]}") level=("${steps[@]}") next
    for _ in $(seq 8); do  # tasks and their children, a few generations deep
      next=()
      for pid in "${level[@]}"; do
        for child in $(pgrep -P "$pid" 2>/dev/null || true); do next+=("$child"); done
      done
      [ "${#next[@]}" -gt 0 ] || break
      victims+=("${next[@]}")
      level=("${next[@]}")
    done
    kill -KILL "${victims[@]}" 2>/dev/null || true
  fi
  stop_pidfiles "$STATE/munged.pid"
  rm -rf "$STATE"
}

wait_idle() {  # deadline in seconds
  local end=$((SECONDS + $1)) state=""
  while [ $SECONDS -lt $end ]; do
    state=$(SLURM_CONF="$STATE/slurm.conf" timeout 5 sinfo -h -N -o '%t' 2>/dev/null || true)
    case "$state" in idle*) return 0 ;; esac
    sleep 0.2
  done
  echo "slurm.sh: the node is '${state:-not listed}' after $1 s; the logs:" >&2
  tail -n 20 "$STATE"/*.log >&2 || true
  die "Slurm did not come up"
}

up() {
  [ "$(id -u)" -eq 0 ] || die "needs root (slurmd runs tasks as their user)"
  for d in munged slurmctld slurmd; do
    [ -x "$SBIN/$d" ] || die "$SBIN/$d not found: apt-get install slurmctld slurmd munge"
  done
  down
  local node
  node=$(hostname -s)
  mkdir -p "$STATE"/{munge,ctld,spool}
  chmod 700 "$STATE"
  chmod 755 "$STATE/munge"   # munged's socket directory must be reachable by clients
  # A key for this test only: 1024 random bytes, readable by root alone.
  (umask 077 && head -c 1024 /dev/urandom > "$STATE/munge.key")
  "$SBIN/munged" --key-file="$STATE/munge.key" --socket="$STATE/munge/munge.socket" \
    --pid-file="$STATE/munged.pid" --log-file="$STATE/munged.log" \
    --seed-file="$STATE/munged.seed" --force \
    || { cat "$STATE/munged.log" >&2 2>/dev/null || true; die "munged did not start"; }

  cat > "$STATE/slurm.conf" <<CONF
ClusterName=tutti-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$STATE/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=3
MinJobAge=10
NodeName=$node NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=10 State=UP OverSubscribe=YES
CONF
  export SLURM_CONF="$STATE/slurm.conf"
  "$SBIN/slurmctld" -f "$SLURM_CONF" -i \
    || { tail -n 20 "$STATE/slurmctld.log" >&2 || true; die "slurmctld did not start"; }
  "$SBIN/slurmd" -f "$SLURM_CONF" \
    || { tail -n 20 "$STATE/slurmd.log" >&2 || true; die "slurmd did not start"; }
  wait_idle 30
  echo "slurm.sh: node $node idle (SLURM_CONF=$SLURM_CONF)"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "export SLURM_CONF=$STATE/slurm.conf" ;;
  *) die "usage: slurm.sh up | down | env" ;;
esac
