#!/usr/bin/env bash
# firewalld for the integration tests (tests/it/firewall/firewalld.rs): a second minimal Debian 12 tree
# with firewalld, booted with systemd-nspawn in a network namespace of its own, so firewalld
# filters only that namespace and never this machine's own network (Docker, the other tests).
#
#   tests/testbed/firewalld.sh         set up and boot (idempotent: a booted machine is left alone)
#   tests/testbed/firewalld.sh down    stop it
#   tests/testbed/firewalld.sh status  say whether firewalld answers
#
# What the tests reach, on the host:
#   /run/mesh-host-fw/bus/system_bus_socket   the machine's system bus (systemd, firewalld)
#   /run/mesh-host-fw/leader                  the pid of the machine's init: `nsenter -t PID -n`
#                                             runs a program in the machine's network namespace
#   netns meshfw-peer                         the other end of the machine's eth0, where the
#                                             tests send packets from: the machine is 10.79.0.1
#                                             and fd79::1, the peer 10.79.0.2 and fd79::2
# Runs as root on a fresh Debian 12 machine. The tree is a copy of the base tree debian.sh
# debootstraps once for both machines, with firewalld added (a marker file in it says so), so
# later runs only boot it.
set -euo pipefail

NAME=mesh-host-fw
ROOT=/var/lib/machines/$NAME
RUN=/run/$NAME
BUSDIR=$RUN/bus
SOCKET=$BUSDIR/system_bus_socket
PIDFILE=$RUN/nspawn.pid
LEADER=$RUN/leader
LOG=$RUN/nspawn.log
MARKER=$ROOT/.mesh-host-fw-ready-2
PEER=meshfw-peer

now_us() { local t=${EPOCHREALTIME/./}; echo "${t#0}"; }
t0=$(now_us)
elapsed() { local d=$(( $(now_us) - t0 )); printf '%d.%01ds' $((d / 1000000)) $(((d % 1000000) / 100000)); }
say() { echo "testbed firewalld: $* ($(elapsed))"; }

firewalld_state() {
  busctl --address="unix:path=$SOCKET" get-property org.fedoraproject.FirewallD1 /org/fedoraproject/FirewallD1 \
    org.fedoraproject.FirewallD1 state 2>/dev/null | sed -e 's/^s "//' -e 's/"$//'
}

alive() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

# The machine's link to the peer namespace, made again if a test or a restart lost it.
wired() {
  [[ -f $LEADER ]] && ip netns exec "$PEER" ping -c 1 -W 1 10.79.0.1 >/dev/null 2>&1
}

down() {
  if alive; then
    local pid; pid=$(cat "$PIDFILE")
    kill -TERM "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
    say "stopped"
  else
    say "not running"
  fi
  rm -f "$PIDFILE" "$LEADER"
  ip netns del "$PEER" 2>/dev/null || true
}

case "${1:-up}" in
  down) down; exit 0 ;;
  status)
    if alive && [[ $(firewalld_state) == RUNNING ]] && wired; then
      echo "firewalld RUNNING: unix:path=$SOCKET, leader $(cat "$LEADER")"; exit 0
    fi
    echo "not running"; exit 1 ;;
  up) ;;
  *) echo "usage: $0 [up|down|status]" >&2; exit 2 ;;
esac

need=()
for p in systemd systemd-container debootstrap iproute2 iputils-ping; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
if ((${#need[@]})); then
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  say "installed ${need[*]}"
fi

# firewalld RUNNING, waited for at most 60 s; on failure the machine is taken down, so the next
# run boots it afresh.
await_running() {
  local state=
  for _ in $(seq 1 600); do
    state=$(firewalld_state || true)
    [[ $state == RUNNING ]] && return 0
    alive || { say "systemd-nspawn exited; its log:"; tail -30 "$LOG"; down; exit 1; }
    sleep 0.1
  done
  say "firewalld not RUNNING after 60s (${state:-unanswered}); its journal:"
  journalctl -D "$ROOT/var/log/journal" -u firewalld.service -n 20 --no-pager || true
  down
  exit 1
}

bus() { busctl --address="unix:path=$SOCKET" "$@"; }

if [[ -f $MARKER ]] && alive && wired; then
  # A test that retired firewalld (the flip) may have left it stopped and disabled: enabled
  # and started again, as the machine boots.
  if [[ $(firewalld_state) != RUNNING ]]; then
    bus call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager \
      EnableUnitFiles asbb 1 firewalld.service false true >/dev/null
    bus call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager \
      StartUnit ss firewalld.service replace >/dev/null
    await_running
    say "firewalld started again"
  fi
  say "already up at unix:path=$SOCKET, leader $(cat "$LEADER")"
  exit 0
fi

down >/dev/null
if [[ ! -f $MARKER ]]; then
  mkdir -p "$RUN"
  rm -rf "$ROOT"
  mkdir -p /var/lib/machines
  # The base tree systemd.sh's machine is a copy of too (debian.sh): one debootstrap for both.
  bash "$(dirname "$0")/debian.sh" "$ROOT"
  # firewalld through apt inside the tree, not debootstrap's --include: its polkitd needs a
  # logind, a virtual package debootstrap does not resolve. netbase: firewalld checks the
  # protocols its stock services name against /etc/protocols, and exits without it. Nothing is
  # started meanwhile.
  printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
  chmod 755 "$ROOT/usr/sbin/policy-rc.d"
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  { chroot "$ROOT" apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive chroot "$ROOT" apt-get install -y -qq --no-install-recommends \
        firewalld nftables iproute2 netbase; } >"$RUN.apt.log" 2>&1 || { tail -20 "$RUN.apt.log"; exit 1; }
  rm -f "$ROOT/usr/sbin/policy-rc.d"
  chroot "$ROOT" systemctl enable firewalld.service >/dev/null 2>&1
  for u in getty@tty1.service console-getty.service systemd-networkd.service systemd-resolved.service; do
    ln -sf /dev/null "$ROOT/etc/systemd/system/$u"
  done
  echo "$NAME" >"$ROOT/etc/hostname"
  touch "$MARKER"
  say "made $ROOT"
fi

mkdir -p "$BUSDIR"
rm -rf "${BUSDIR:?}"/*
# --private-network: the machine has only its loopback until the veth below is moved in.
setsid systemd-nspawn -D "$ROOT" -M "$NAME" -b --register=no --keep-unit --console=passive \
  --private-network --bind="$BUSDIR:/run/dbus" </dev/null >"$LOG" 2>&1 &
nspawn=$!
echo "$nspawn" >"$PIDFILE"

# The machine's init is systemd-nspawn's child, once it has become systemd: before that, the
# child is a short-lived fork of systemd-nspawn already in the new network namespace, and a
# veth moved into its namespace by pid fails ("RTNETLINK answers: No such process") when it
# exits first, as it did on a fresh machine's first boot of the machine.
leader=
for _ in $(seq 1 300); do
  leader=$(cat /proc/"$nspawn"/task/*/children 2>/dev/null | tr ' ' '\n' | grep -m1 . || true)
  [[ -n $leader ]] && [[ $(readlink /proc/"$leader"/ns/net) != "$(readlink /proc/self/ns/net)" ]] \
    && [[ $(cat /proc/"$leader"/comm 2>/dev/null) == systemd ]] && break
  leader=
  sleep 0.1
done
[[ -n $leader ]] || { say "no machine process under systemd-nspawn $nspawn; log:"; tail -30 "$LOG"; exit 1; }
echo "$leader" >"$LEADER"

ip netns add "$PEER"
ip -n "$PEER" link add peer0 type veth peer name eth0 netns "$leader"
ip -n "$PEER" addr add 10.79.0.2/24 dev peer0
ip -n "$PEER" addr add fd79::2/64 dev peer0 nodad
ip -n "$PEER" link set peer0 up
ip -n "$PEER" link set lo up
nsenter -t "$leader" -n ip addr add 10.79.0.1/24 dev eth0
nsenter -t "$leader" -n ip addr add fd79::1/64 dev eth0 nodad
nsenter -t "$leader" -n ip link set eth0 up
nsenter -t "$leader" -n ip link set lo up

await_running
wired || { say "firewalld runs but the peer cannot ping the machine"; down; exit 1; }
say "booted, firewalld RUNNING, bus unix:path=$SOCKET, leader $leader"
