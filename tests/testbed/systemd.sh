#!/usr/bin/env bash
# A real systemd for the integration tests: a minimal Debian 12 tree booted with systemd-nspawn,
# its system bus bound to a directory on the host so the agent under test reaches it with
# `--bus unix:path=/run/mesh-host-testbed/bus/system_bus_socket`.
#
#   tests/testbed/systemd.sh         set up and boot (idempotent: a booted testbed is left alone)
#   tests/testbed/systemd.sh down    stop it (SIGTERM to systemd-nspawn)
#   tests/testbed/systemd.sh status  say whether it answers
#
# Runs as root on a fresh Debian 12 machine. The tree is a copy of the base tree debian.sh
# debootstraps once for both machines; a marker file in it says it is made, and later runs skip
# that.
set -euo pipefail

NAME=mesh-host-testbed
ROOT=/var/lib/machines/$NAME
RUN=/run/$NAME
BUSDIR=$RUN/bus
SOCKET=$BUSDIR/system_bus_socket
PIDFILE=$RUN/nspawn.pid
LOG=$RUN/nspawn.log
MARKER=$ROOT/.mesh-host-testbed-ready

# Microseconds since the epoch, from bash itself (5.0 and later): no external tool needed.
now_us() { local t=${EPOCHREALTIME/./}; echo "${t#0}"; }
t0=$(now_us)
elapsed() { local d=$(( $(now_us) - t0 )); printf '%d.%01ds' $((d / 1000000)) $(((d % 1000000) / 100000)); }
say() { echo "testbed systemd: $* ($(elapsed))"; }

system_state() {
  busctl --address="unix:path=$SOCKET" get-property org.freedesktop.systemd1 /org/freedesktop/systemd1 \
    org.freedesktop.systemd1.Manager SystemState 2>/dev/null | sed -e 's/^s "//' -e 's/"$//'
}

alive() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

# Booted. `degraded` counts: a unit failed inside (a test's unit that dies at once on purpose
# leaves one), and the manager answers all the same.
up() { [[ $1 == running || $1 == degraded ]]; }

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
  rm -f "$PIDFILE"
}

case "${1:-up}" in
  down) down; exit 0 ;;
  status)
    if alive && up "$(system_state)"; then echo "$(system_state): unix:path=$SOCKET"; exit 0; fi
    echo "not running"; exit 1 ;;
  up) ;;
  *) echo "usage: $0 [up|down|status]" >&2; exit 2 ;;
esac

if alive && up "$(system_state)"; then
  say "already $(system_state) at unix:path=$SOCKET"
  exit 0
fi

# busctl (from the host's systemd package) asks the bus; dpkg-dev and apt-utils build the
# tests' local apt repository; passwd has useradd for the user tests.
need=()
for p in systemd systemd-container debootstrap apt-utils dpkg-dev passwd; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
if ((${#need[@]})); then
  SECONDS=0
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  echo "testbed systemd: installed ${need[*]} (${SECONDS}s)"
fi

if [[ ! -f $MARKER ]]; then
  mkdir -p "$RUN"
  rm -rf "$ROOT"
  mkdir -p /var/lib/machines
  # Debian 12 with systemd: a copy of the base tree firewalld.sh's machine starts from too.
  bash "$(dirname "$0")/debian.sh" "$ROOT"
  # Nothing inside needs a console login or the network set up; fewer units, faster boot.
  for u in getty@tty1.service console-getty.service systemd-networkd.service systemd-resolved.service; do
    ln -sf /dev/null "$ROOT/etc/systemd/system/$u"
  done
  echo "$NAME" >"$ROOT/etc/hostname"
  touch "$MARKER"
  say "made $ROOT"
fi

# A leftover nspawn (its pid file gone, or not answering) would hold the machine name.
down >/dev/null
mkdir -p "$BUSDIR"
rm -rf "${BUSDIR:?}"/*
# setsid: the testbed outlives this script and the shell that ran it.
setsid systemd-nspawn -D "$ROOT" -M "$NAME" -b --register=no --keep-unit --console=passive \
  --bind="$BUSDIR:/run/dbus" </dev/null >"$LOG" 2>&1 &
echo $! >"$PIDFILE"

for _ in $(seq 1 300); do
  state=$(system_state || true)
  case "$state" in
    running) say "booted, SystemState running, bus unix:path=$SOCKET"; exit 0 ;;
    degraded)
      say "booted, but a unit failed at boot (SystemState degraded); the manager answers, so the tests can run. Failed units:"
      busctl --address="unix:path=$SOCKET" call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
        org.freedesktop.systemd1.Manager ListUnitsFiltered as 1 failed || true
      exit 0 ;;
  esac
  alive || { say "systemd-nspawn exited; its log:"; tail -30 "$LOG"; exit 1; }
  sleep 0.1
done
say "not running after 30s (SystemState ${state:-unanswered}); log in $LOG"
exit 1
