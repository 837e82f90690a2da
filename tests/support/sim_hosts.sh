#!/bin/bash
# Simulated hosts on one machine: network namespaces on a bridge, real (virtual) links between
# them, and the faults of a real network. The one place that spells the `ip` and `tc` commands;
# tests/support/sim_cluster.h drives it from ctest, benches and by-hand runs call it directly.
#
#   sim_hosts.sh create NAME N          N hosts NAME-h1..NAME-hN, 10.77.0.1..N/24 on eth0, one
#                                       bridge in NAME-br; lo up in each
#   sim_hosts.sh destroy NAME           kill every process on the hosts, delete the namespaces
#   sim_hosts.sh gc                     destroy clusters named lk<PID>[x<N>] whose PID is gone
#   sim_hosts.sh addr NAME I            the address of host I
#   sim_hosts.sh exec NAME I CMD...     run CMD on host I with a private tmpfs /dev/shm (so shm
#                                       groups form only within a host)
#   sim_hosts.sh supervise NAME I PIDFILE CMD...
#                                       as exec, and restart CMD after each exit a pod's
#                                       supervisor restarts (not 0, 1, 2, 3: the job ended, a
#                                       usage error, a diverged training): at once after 75 (it
#                                       left a fenced attempt), after $SIM_RESTART_DELAY (15) s
#                                       otherwise, as a Job replaces a crashed pod; PIDFILE holds
#                                       CMD's pid
#   sim_hosts.sh cut NAME I J           no packet between hosts I and J (blackhole routes both
#                                       ways); both still reach every other host
#   sim_hosts.sh heal NAME I J          undo cut
#   sim_hosts.sh isolate NAME I         host I's link down
#   sim_hosts.sh reconnect NAME I       host I's link up again
#   sim_hosts.sh throttle NAME I RATE   host I's link limited to RATE (tc tbf, both directions),
#                                       e.g. 1mbit
#   sim_hosts.sh unthrottle NAME I
#
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN). Addresses exist only inside the cluster's own
# namespaces; nothing is added outside them.
set -euo pipefail

die() {
  echo "sim_hosts.sh: $*" >&2
  exit 1
}

addr() { echo "10.77.0.$2"; }
hostns() { echo "$1-h$2"; }

create() {
  local name=$1 n=$2
  [[ $n -ge 1 && $n -le 200 ]] || die "create: N must be 1..200, got $n"
  ip netns add "$name-br"
  ip -n "$name-br" link add br0 type bridge
  ip -n "$name-br" link set br0 up
  ip -n "$name-br" link set lo up
  local i
  for ((i = 1; i <= n; i++)); do
    local ns
    ns=$(hostns "$name" "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$name-br" link add "v$i" type veth peer name eth0 netns "$ns"
    ip -n "$name-br" link set "v$i" master br0
    ip -n "$name-br" link set "v$i" up
    ip -n "$ns" addr add "$(addr "$name" "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

destroy() {
  local name=$1 ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-(h[0-9]+|br)\$" || true); do
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
  done
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-(h[0-9]+|br)\$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
}

gc() {
  local name
  for name in $(ip netns list | awk '{print $1}' | sed -nE 's/^(lk[0-9]+(x[0-9]+)?)-br$/\1/p' | sort -u); do
    local pid=${name#lk}
    [[ -d /proc/${pid%%x*} ]] || destroy "$name"
  done
}

private_shm() {
  # The host's own /dev/shm, then CMD in its place (exec keeps the pid).
  echo 'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"'
}

run_on() {
  local name=$1 i=$2
  shift 2
  exec ip netns exec "$(hostns "$name" "$i")" unshare -m --propagation private \
    sh -c "$(private_shm)" sh "$@"
}

supervise() {
  local name=$1 i=$2 pidfile=$3
  shift 3
  # shellcheck disable=SC2016
  local loop='pidfile=$1; shift
while :; do
  "$@" & echo $! > "$pidfile"
  wait $!; rc=$?
  case $rc in 0|1|2|3) exit $rc ;; esac
  # 75: it left a fenced attempt, the coordinator knows; anything else (a signal, a crash) is
  # replaced as a Job replaces a failed pod, after the scheduling and start that takes.
  delay=0.2; [ "$rc" = 75 ] || delay=${SIM_RESTART_DELAY:-15}
  echo "sim_hosts.sh: $1 exited with $rc; restarting it in $delay s" >&2
  sleep "$delay"
done'
  exec ip netns exec "$(hostns "$name" "$i")" unshare -m --propagation private \
    sh -c "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec sh -c '$loop' sh \"\$@\"" \
    sh "$pidfile" "$@"
}

route_both() {  # add|del NAME I J
  local op=$1 name=$2 i=$3 j=$4
  ip -n "$(hostns "$name" "$i")" route "$op" blackhole "$(addr "$name" "$j")/32"
  ip -n "$(hostns "$name" "$j")" route "$op" blackhole "$(addr "$name" "$i")/32"
}

throttle() {
  local name=$1 i=$2 rate=$3
  ip netns exec "$(hostns "$name" "$i")" tc qdisc replace dev eth0 root tbf rate "$rate" \
    burst 32kbit latency 400ms
  ip netns exec "$name-br" tc qdisc replace dev "v$i" root tbf rate "$rate" burst 32kbit \
    latency 400ms
}

unthrottle() {
  local name=$1 i=$2
  ip netns exec "$(hostns "$name" "$i")" tc qdisc del dev eth0 root 2>/dev/null || true
  ip netns exec "$name-br" tc qdisc del dev "v$i" root 2>/dev/null || true
}

[[ $# -ge 1 ]] || die "usage: sim_hosts.sh create|destroy|gc|addr|exec|supervise|cut|heal|isolate|reconnect|throttle|unthrottle ..."
[[ $(id -u) -eq 0 ]] || die "needs root (network and mount namespaces)"
cmd=$1
shift
case $cmd in
  create) create "$@" ;;
  destroy) destroy "$@" ;;
  gc) gc ;;
  addr) addr "$@" ;;
  exec) run_on "$@" ;;
  supervise) supervise "$@" ;;
  cut) route_both add "$@" ;;
  heal) route_both del "$@" ;;
  isolate) ip -n "$(hostns "$1" "$2")" link set eth0 down ;;
  reconnect) ip -n "$(hostns "$1" "$2")" link set eth0 up ;;
  throttle) throttle "$@" ;;
  unthrottle) unthrottle "$@" ;;
  *) die "unknown command $cmd" ;;
esac
