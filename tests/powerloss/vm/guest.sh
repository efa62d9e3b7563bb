#!/bin/sh
# shellcheck shell=sh disable=SC3040 # busybox ash, which has pipefail
# The VM lane in the guest (busybox sh), for one filesystem (tests/powerloss/vm/README.md).
# Disks: vda this payload (read-only), vdb the data device (made by run.sh), vdc the log, vdd a
# copy of vdb as it was made (the replay target), vde the snapshots' copy-on-write store.
# From the kernel's command line: pl_fs (ext4, xfs, btrfs), pl_opts (mount options), pl_states
# (crash points to visit, 0 for all).
set -euo pipefail
FS=${pl_fs:?}
OPTS=${pl_opts:-defaults}
STATES=${pl_states:-0}
ROOT=/mnt/t
W=/p/w
MH="mesh-host --state $ROOT/state/state.json"
SZ=$(blockdev --getsz /dev/vdb)

say() { echo "$*" > /dev/console; }
mark() { dmsetup message lw 0 mark "$1"; }

dmsetup create lw --table "0 $SZ log-writes /dev/vdb /dev/vdc"
# shellcheck disable=SC2086 # OPTS is one word
mount -t "$FS" -o $OPTS /dev/mapper/lw $ROOT
say "PLINFO mounted $FS -o $OPTS: $(grep ' /mnt/t ' /proc/mounts)"
mkdir -p $ROOT/state $ROOT/srv
cp $W/conf.json $ROOT/srv/conf.json
sync
plvm manifest $ROOT/srv /tmp/m0
: > /tmp/s0
mark ready

t0=$(date +%s)
mark cold-start
$MH apply $W/cold.json --json > /tmp/cold.out 2>/tmp/cold.err || { say "PLERROR cold apply: $(tail -3 /tmp/cold.err)"; exit 1; }
mark cold-done
plvm manifest $ROOT/srv /tmp/m1
cp $ROOT/state/state.json /tmp/s1
say "PLINFO cold apply $(( $(date +%s) - t0 )) s, $(grep -c '"created"' /tmp/cold.out) created"

t0=$(date +%s)
mark change-start
$MH apply $W/change.json --json > /tmp/change.out 2>/tmp/change.err || { say "PLERROR change apply: $(tail -3 /tmp/change.err)"; exit 1; }
mark change-done
plvm manifest $ROOT/srv /tmp/m2
cp $ROOT/state/state.json /tmp/s2
say "PLINFO change apply $(( $(date +%s) - t0 )) s: $(grep -o '"action": "[a-z]*"' /tmp/change.out | sort | uniq -c | tr -s ' \n' ' ')"

t0=$(date +%s)
mark daemon-start
$MH run --declaration $W/change.json --metrics off --resync 3600 > /tmp/daemon.log 2>&1 &
daemon=$!
# Its first pass (everything unchanged) before the hand-edits, so each edit is a correction.
i=0
until grep -q 'mesh-host is running' /tmp/daemon.log || [ $i -ge 120 ]; do sleep 1; i=$((i + 1)); done
sleep 2
while read -r f; do echo "a hand edit" > "$f"; done < $W/edits.txt
i=0
end=$(( $(date +%s) + 300 ))
until [ "$(plvm check $ROOT/srv /tmp/m2 /tmp/m2 1 2>/dev/null)" = "torn=0 lost=0" ] || [ "$(date +%s)" -ge $end ]; do sleep 1; done
# The correction is visible at its rename; the agent syncs it just after (rename-first on ext4).
sleep 3
mark daemon-done
kill -TERM $daemon
wait $daemon || true
say "PLINFO daemon $(( $(date +%s) - t0 )) s, corrections: $(grep -c 'corrected' /tmp/daemon.log || true)"
plvm check $ROOT/srv /tmp/m2 /tmp/m2 1 > /tmp/d.res 2>&1 || true
say "PLINFO daemon live check: $(tail -1 /tmp/d.res)"

# The agent stopped at each of its failpoints (system::fs::failpoint: it aborts there) in an
# apply of a third content, with a mark written just after each death: replayed to the mark,
# the disk is a power cut at the moment the process died. Each run starts from what the one
# before left (its journal and temporaries); a last whole apply converges.
t0=$(date +%s)
cp $ROOT/state/state.json /tmp/s3
mark fp-start
for fp in batch-staged batch-renamed store-write; do
    if MESH_HOST_FAILPOINT=$fp $MH apply $W/again.json --json > /tmp/fp.out 2>/tmp/fp.err; then
        say "PLERROR the failpoint $fp did not stop the apply"; exit 1
    fi
    mark "fp-$fp"
done
$MH apply $W/again.json --json > /tmp/again.out 2>/tmp/again.err || { say "PLERROR apply after the failpoints: $(tail -3 /tmp/again.err)"; exit 1; }
mark fp-done
plvm manifest $ROOT/srv /tmp/m3
say "PLINFO failpoints $(( $(date +%s) - t0 )) s: $(grep -o '"action": "[a-z]*"' /tmp/again.out | sort | uniq -c | tr -s ' \n' ' ')"
umount $ROOT
dmsetup remove lw
plvm list /dev/vdc > /tmp/list
say "PLINFO log: $(head -1 /tmp/list)"

# Every crash point: the replay target as a power cut there leaves it, seen through a snapshot
# so that mounting it (the filesystem's own log replay) and the next apply leave it unchanged.
cat > /tmp/hook.sh <<HOOK
set -u
ROOT=$ROOT; W=$W; FS=$FS; OPTS=$OPTS; SZ=$SZ
HOOK
cat >> /tmp/hook.sh <<'HOOK'
# A hang at a crash point is a finding, not a wait until run.sh's timeout: the agent is killed
# after 5 minutes and the point counted failed; a task stuck in the kernel panics the guest with
# its stack on the console (below).
MH="timeout -s KILL 300 mesh-host --state $ROOT/state/state.json"
case "$PL_MARK" in
    -) exit 0 ;;
    ready|cold-start) wl=cold b=/tmp/m0 a=/tmp/m1 done=0 ign=/dev/null decl=cold sb=/tmp/s0 ;;
    cold-done) wl=cold b=/tmp/m0 a=/tmp/m1 done=1 ign=/dev/null decl=cold sb=/tmp/s0 ;;
    change-start) wl=change b=/tmp/m1 a=/tmp/m2 done=0 ign=/dev/null decl=change sb=/tmp/s1 ;;
    change-done) wl=change b=/tmp/m1 a=/tmp/m2 done=1 ign=/dev/null decl=change sb=/tmp/s1 ;;
    daemon-start) wl=daemon b=/tmp/m2 a=/tmp/m2 done=0 ign=$W/edits.txt decl=change sb=/dev/null ;;
    daemon-done) wl=daemon b=/tmp/m2 a=/tmp/m2 done=1 ign=/dev/null decl=change sb=/dev/null ;;
    fp-start|fp-batch-staged|fp-batch-renamed|fp-store-write) wl=failpoint b=/tmp/m2 a=/tmp/m3 done=0 ign=/dev/null decl=again sb=/tmp/s3 ;;
    *) wl=failpoint b=/tmp/m2 a=/tmp/m3 done=1 ign=/dev/null decl=again sb=/tmp/s3 ;;
esac
echo "PLVISIT index=$PL_INDEX kind=$PL_KIND mark=$PL_MARK" > /dev/console
dmsetup create snap --table "0 $SZ snapshot /dev/vdd /dev/vde N 8"
res="torn=0 lost=0"; ahead="ahead=0 behind=0"; drift="drift=0 failed=0"; temps="temps=0"; journal="journal=0"; mountfail=0
if mount -t "$FS" -o "$OPTS" /dev/mapper/snap "$ROOT" 2>/tmp/mount.err; then
    res=$(plvm check "$ROOT/srv" "$b" "$a" "$done" "$ign" 2>/tmp/check.err)
    if $MH status --json > /tmp/status.json 2>/tmp/status.err; then
        # The store the workload started from (its work not yet recorded): behind, not ahead.
        store=after
        if [ ! -e "$ROOT/state/state.json" ] || cmp -s "$ROOT/state/state.json" "$sb"; then store=before; fi
        ahead=$(plvm ahead /tmp/status.json "$ROOT/srv" "$a" "$store" "$ign" 2>>/tmp/check.err)
    else
        ahead="ahead=1"; echo "store unreadable: $(tail -2 /tmp/status.err)" >> /tmp/check.err
    fi
    # What the crash left of the journal of intent, told where a temporary outlives the apply.
    jinfo="no journal"
    j="$ROOT/state/state.json.journal"
    [ -e "$j" ] && jinfo="journal: $(wc -c < "$j") bytes, $(grep -c '"dir"' "$j") directory lines"
    journal=$(plvm journal "$j" "$ROOT/" 2>>/tmp/check.err) || journal="journal=1"
    $MH apply "$W/$decl.json" --json > /tmp/apply.json 2>/tmp/apply.err || true
    [ -s /tmp/apply.json ] || echo "apply gave no report (killed after 300 s?): $(tail -2 /tmp/apply.err)" >> /tmp/check.err
    drift=$(plvm drift /tmp/apply.json "$ign" 2>>/tmp/check.err) || drift="drift=0 failed=1"
    temps=$(plvm temps "$ROOT/srv" 2>>/tmp/check.err)
    [ "$temps" = "temps=0" ] || echo "$jinfo before the next apply" >> /tmp/check.err
    again=$(plvm check "$ROOT/srv" "$a" "$a" 1 "$ign" 2>>/tmp/check.err)
    [ "$again" = "torn=0 lost=0" ] || { echo "not converged: $again" >> /tmp/check.err; drift="$drift unconverged=1"; }
    umount "$ROOT"
else
    mountfail=1
    echo "mount failed: $(tail -2 /tmp/mount.err)" > /tmp/check.err
fi
dmsetup remove snap
echo "PLSTATE fs=$FS opts=$OPTS workload=$wl index=$PL_INDEX kind=$PL_KIND mark=$PL_MARK $res $ahead $drift $temps $journal mountfail=$mountfail" > /dev/console
sed 's/^/PLDETAIL /' /tmp/check.err | head -5 > /dev/console
exit 0
HOOK
# A task blocked in the kernel for 2 minutes (a mount, an unmount, a sync) ends the run with its
# stack on the console, instead of a silent guest until run.sh's timeout.
echo 120 > /proc/sys/kernel/hung_task_timeout_secs || true
echo 1 > /proc/sys/kernel/hung_task_panic || true
dmesg -n 4 || true
plvm replay /dev/vdc /dev/vdd "$STATES" "sh /tmp/hook.sh"
say "PLDONE fs=$FS"
