#!/usr/bin/env bash
# Four "hosts" on this machine for multi-host tests: network namespaces rf-h0..rf-h3 with their
# own addresses 10.77.0.10..13, joined by a bridge rfbr0 (10.77.0.1, where the test's broker
# listens). Needs root (CAP_NET_ADMIN) and a kernel that allows network namespaces.
#
#   scripts/netns.sh check        # exit 0 if namespaces can be created here
#   scripts/netns.sh up | down
#   scripts/netns.sh cut N        # take host N off the network (its link down)
#   scripts/netns.sh heal N       # and back
set -euo pipefail

hosts=4
bridge=rfbr0

up() {
  down >/dev/null 2>&1 || true
  ip link add "$bridge" type bridge
  ip addr add 10.77.0.1/24 dev "$bridge"
  ip link set "$bridge" up
  for i in $(seq 0 $((hosts - 1))); do
    ns="rf-h$i"
    ip netns add "$ns"
    ip link add "rfv$i" type veth peer name eth0 netns "$ns"
    ip link set "rfv$i" master "$bridge" up
    ip -n "$ns" addr add "10.77.0.1$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via 10.77.0.1
  done
}

down() {
  for i in $(seq 0 $((hosts - 1))); do
    ip netns pids "rf-h$i" 2>/dev/null | xargs -r kill -9 || true
    ip netns del "rf-h$i" 2>/dev/null || true
    ip link del "rfv$i" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
}

# A probe named for this process: two runs probing at once must not take each other's for a failure.
check() {
  ip netns add "rf-probe-$$" 2>/dev/null && ip netns del "rf-probe-$$"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  check) check ;;
  cut) ip link set "rfv$2" down ;;
  heal) ip link set "rfv$2" up ;;
  *) echo "usage: $0 check|up|down|cut N|heal N" >&2; exit 2 ;;
esac
