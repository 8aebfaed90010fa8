#!/usr/bin/env bash
# Simulated hosts for multi-host tests, on this one machine (needs root).
#
#   hosts.sh up [N]          N hosts (default 3): tutti-h1..tutti-hN
#   hosts.sh down            tear everything down (safe to call at any time, repeatedly)
#   hosts.sh env             print the variables a test exports (PATH with the ssh wrapper)
#   hosts.sh link HOST down|up
#   hosts.sh limit HOST RATE (e.g. 1gbit: tc tbf on the host's side of its link; "off" clears)
#   hosts.sh exec HOST CMD…  run CMD inside HOST's network and UTS namespaces
#
# Each host is a network namespace joined to the bridge tutti-br0 by a veth pair, with its
# own host name (a UTS namespace) and its own sshd. The launching machine is on the bridge
# too, as tutti-h0. Addresses come from 198.18.0.0/24 (RFC 2544's benchmarking range, used
# nowhere else here); names resolve through /etc/hosts lines tagged "# tutti-multihost",
# removed by `down`. Every host shares this machine's file system, as hosts share a home
# directory over NFS. ssh reaches them with a key and a known_hosts file made for the test:
# `env` prints a PATH whose first entry holds an `ssh` that adds `-F` with that config, so
# tuttirun and mpirun use the real OpenSSH client unchanged.
set -euo pipefail

STATE=${TUTTI_MULTIHOST_DIR:-/tmp/tutti-multihost}
BRIDGE=tutti-br0
NET=198.18.0
TAG="# tutti-multihost"
SSHD=/usr/sbin/sshd

die() { echo "hosts.sh: $*" >&2; exit 1; }
ns() { echo "tutti-h$1"; }

down() {
  if [ -d "$STATE" ]; then
    for pidfile in "$STATE"/sshd-*.pid; do
      [ -e "$pidfile" ] || continue
      pid=$(cat "$pidfile" 2>/dev/null || true)
      [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    done
  fi
  # Whatever still runs inside a host's namespace (ranks, sshd children) ends with it.
  for n in $(ip netns list 2>/dev/null | awk '/^tutti-h[0-9]+/ {print $1}'); do
    for pid in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns delete "$n" 2>/dev/null || true
  done
  # A deleted namespace may outlive its processes for a while (the kernel finishing its TCP
  # sockets): remove our ends of the links now, which removes both ends.
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
                grep '^veth-tutti-h[0-9]*$' || true); do
    ip link delete "$link" 2>/dev/null || true
  done
  ip link delete "$BRIDGE" 2>/dev/null || true
  if grep -q "$TAG" /etc/hosts 2>/dev/null; then
    # /etc/hosts may be a bind mount: rewrite it in place rather than replace the file.
    grep -v "$TAG" /etc/hosts > "/tmp/tutti-hosts.$$" || true
    cat "/tmp/tutti-hosts.$$" > /etc/hosts
    rm -f "/tmp/tutti-hosts.$$"
  fi
  rm -rf "$STATE"
}

wait_for_ssh() {  # host index, deadline in seconds
  local end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    if "$STATE/bin/ssh" -o ConnectTimeout=2 "$(ns "$1")" true 2>/dev/null; then return 0; fi
    sleep 0.2
  done
  cat "$STATE/sshd-$1.log" >&2 || true
  die "sshd of $(ns "$1") did not answer within $2 s"
}

up() {
  local count=${1:-3}
  [ "$(id -u)" -eq 0 ] || die "needs root (ip netns, veth, a bridge, sshd)"
  [ -x "$SSHD" ] || die "$SSHD not found: apt-get install openssh-server"
  down
  mkdir -p "$STATE/bin" /run/sshd
  chmod 700 "$STATE"
  ssh-keygen -q -t ed25519 -N "" -f "$STATE/id" -C tutti-multihost
  ssh-keygen -q -t ed25519 -N "" -f "$STATE/host_key" -C tutti-multihost-host
  cp "$STATE/id.pub" "$STATE/authorized_keys"
  : > "$STATE/known_hosts"
  cat > "$STATE/ssh_config" <<EOF
Host *
  IdentityFile $STATE/id
  IdentitiesOnly yes
  UserKnownHostsFile $STATE/known_hosts
  StrictHostKeyChecking no
  LogLevel ERROR
  BatchMode yes
  ConnectTimeout 5
EOF
  cat > "$STATE/bin/ssh" <<EOF
#!/bin/sh
exec /usr/bin/ssh -F "$STATE/ssh_config" "\$@"
EOF
  chmod +x "$STATE/bin/ssh"

  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local hosts_lines="$NET.1 tutti-h0 $TAG"$'\n'
  for i in $(seq 1 "$count"); do
    local n addr
    n=$(ns "$i"); addr="$NET.$((10 + i))"
    ip netns add "$n"
    ip link add "veth-$n" type veth peer name eth0 netns "$n"
    ip link set "veth-$n" master "$BRIDGE" up
    ip -n "$n" addr add "$addr/24" dev eth0
    ip -n "$n" link set eth0 up
    ip -n "$n" link set lo up
    ip -n "$n" route add default via "$NET.1"
    hosts_lines+="$addr $n $TAG"$'\n'
    cat > "$STATE/sshd-$i.conf" <<EOF
ListenAddress $addr
Port 22
HostKey $STATE/host_key
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $STATE/sshd-$i.pid
MaxStartups 100:30:200
MaxSessions 100
ClientAliveInterval 1
ClientAliveCountMax 2
EOF
    # -D: sshd stays in the foreground of this background job; its pid lands in the PidFile.
    ip netns exec "$n" unshare --uts sh -c \
      "hostname $n && exec $SSHD -D -f $STATE/sshd-$i.conf -E $STATE/sshd-$i.log" \
      </dev/null >/dev/null 2>&1 &
  done
  printf '%s' "$hosts_lines" >> /etc/hosts
  for i in $(seq 1 "$count"); do wait_for_ssh "$i" 20; done
  echo "$count" > "$STATE/count"
  echo "hosts.sh: $count hosts up: $(for i in $(seq 1 "$count"); do printf '%s ' "$(ns "$i")"; done)"
}

case "${1:-}" in
  up) up "${2:-3}" ;;
  down) down ;;
  env) echo "export PATH=$STATE/bin:\$PATH TUTTI_MULTIHOST_DIR=$STATE" ;;
  link)
    [ $# -eq 3 ] || die "usage: hosts.sh link HOST down|up"
    ip link set "veth-$2" "$3" ;;
  limit)
    [ $# -eq 3 ] || die "usage: hosts.sh limit HOST RATE|off"
    ip netns exec "$2" tc qdisc del dev eth0 root 2>/dev/null || true
    if [ "$3" != off ]; then
      ip netns exec "$2" tc qdisc add dev eth0 root tbf rate "$3" burst 256kb latency 50ms
      tc qdisc del dev "veth-$2" root 2>/dev/null || true
      tc qdisc add dev "veth-$2" root tbf rate "$3" burst 256kb latency 50ms
    else
      tc qdisc del dev "veth-$2" root 2>/dev/null || true
    fi ;;
  exec)
    [ $# -ge 3 ] || die "usage: hosts.sh exec HOST CMD..."
    host=$2; shift 2
    pid=$(cat "$STATE/sshd-${host#tutti-h}.pid")
    exec nsenter -t "$pid" -n -u "$@" ;;
  *) die "usage: hosts.sh up [N] | down | env | link HOST down|up | limit HOST RATE|off | exec HOST CMD..." ;;
esac
