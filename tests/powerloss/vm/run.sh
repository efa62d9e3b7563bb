#!/usr/bin/env bash
# The VM power-loss lane (tests/powerloss/vm/README.md): Debian's kernel under QEMU (TCG), the
# agent on ext4, XFS and btrfs over dm-log-writes, every crash point replayed and checked.
#   tests/powerloss/vm/run.sh [STATES] [--mutant] [--short] [--prepare] [--fs ext4,ext4-noauto,xfs,btrfs]
# STATES: crash points visited per filesystem (0, the default: all). --mutant: the agent built
# with the feature powerloss-mutant (no syncs), which must show losses. --short: the CI lane
# (ext4, 200 files in 20 directories, 12 points; a few minutes of TCG). --release: the agent's
# release build in the guest, several times faster under TCG (for the long runs over every
# point). --prepare: only what every run shares (the kernel, busybox, the initramfs, plvm's
# build), so that two runs can then boot side by side without racing to make it (tests/run.sh
# runs the real and the mutant lanes so). Prints, per filesystem and workload:
#   powerloss: lane=vm fs=FS workload=W states=N torn=T lost=L ahead=A other=D+F+J drift=D failed=F behind=B temps=M journal=J
# (other: the sum tests/powerloss/run.sh judges beside torn, lost and ahead).
# Root. Needs network once (apt) unless the testbed's cache holds the kernel and busybox.
set -euo pipefail
# In braces: bash reads all of it before running any, so an edit during a run cannot break it.
{

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
tb=${MESH_HOST_TESTBED:-/var/lib/mesh-host-testbed}/powerloss
states=0 mutant=0 fss=ext4,ext4-noauto,xfs,btrfs files=1000 profile=debug prepare=0
for a in "$@"; do
    case "$a" in
        --mutant) mutant=1 ;;
        --prepare) prepare=1 ;;
        --release) profile=release ;;
        --short) fss=ext4 files=200; [ "$states" = 0 ] && states=12 ;;
        --fs=*) fss=${a#--fs=} ;;
        [0-9]*) states=$a ;;
        *) echo "usage: $0 [STATES] [--mutant] [--short] [--release] [--prepare] [--fs=ext4,ext4-noauto,xfs,btrfs]" >&2; exit 2 ;;
    esac
done

fail() { echo "powerloss vm: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root (apt-get, and mkfs on the images)"

need() { # command, package
    command -v "$1" >/dev/null || fail "$1 missing: apt-get install --no-install-recommends $2"
}
need qemu-system-x86_64 qemu-system-x86
need cpio cpio
need mkfs.ext4 e2fsprogs
need mkfs.xfs xfsprogs
need mkfs.btrfs btrfs-progs
need dmsetup dmsetup
need cargo "rustup (https://rustup.rs)"

# The guest's kernel and busybox, from Debian's archive, cached (nothing installed on the host).
mkdir -p "$tb/dl"
if ! ls "$tb"/kernel/boot/vmlinuz-* >/dev/null 2>&1; then
    pkg=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | awk '{print $1}' | sort -V | tail -1)
    [ -n "$pkg" ] || fail "no linux-image-6.1.0-*-amd64 in apt's lists: apt-get update (Debian 12)"
    (cd "$tb/dl" && apt-get download "$pkg") || fail "apt-get download $pkg failed"
    rm -rf "$tb/kernel" && mkdir -p "$tb/kernel" && dpkg-deb -x "$tb"/dl/linux-image-*.deb "$tb/kernel"
fi
if [ ! -x "$tb/busybox/bin/busybox" ]; then
    (cd "$tb/dl" && apt-get download busybox-static) || fail "apt-get download busybox-static failed"
    rm -rf "$tb/busybox" && mkdir -p "$tb/busybox" && dpkg-deb -x "$tb"/dl/busybox-static*.deb "$tb/busybox"
fi
vmlinuz=$(ls "$tb"/kernel/boot/vmlinuz-*)
kver=${vmlinuz##*/vmlinuz-}
bb=$tb/busybox/bin/busybox
[ -f "$tb/kernel/lib/modules/$kver/modules.dep" ] || (cd "$tb/kernel" && "$bb" depmod -b . "$kver")

# The initramfs: busybox, the modules the lane loads (and theirs), /init.
ir=$tb/initramfs.gz
if [ ! -f "$ir" ] || [ "$here/init" -nt "$ir" ]; then
    st=$(mktemp -d)
    mkdir -p "$st/bin" "$st/proc" "$st/sys" "$st/dev" "$st/lib/modules/$kver"
    cp "$bb" "$st/bin/busybox"
    for l in $("$bb" --list); do [ "$l" = busybox ] || ln -s busybox "$st/bin/$l"; done
    mkdir -p "$st/sbin" && ln -s ../bin/modprobe "$st/sbin/modprobe"
    md=$tb/kernel/lib/modules/$kver
    cp "$md"/modules.dep "$md"/modules.alias "$md"/modules.symbols "$md"/modules.builtin "$md"/modules.order "$st/lib/modules/$kver/"
    for m in virtio_pci virtio_blk dm-mod dm-log-writes dm-snapshot crc32c_generic ext4 xfs btrfs; do
        line=$(grep -E "(^|/)${m//-/[-_]}\.ko:" "$md/modules.dep" || true)
        for f in ${line//:/}; do mkdir -p "$st/lib/modules/$kver/$(dirname "$f")"; cp "$md/$f" "$st/lib/modules/$kver/$f"; done
    done
    # Modules the kernel asks for by alias (crc32c for ext4 and btrfs, xxhash, blake2b).
    extra=$(cd "$md" && find kernel/crypto kernel/arch/x86/crypto kernel/lib -name '*.ko')
    grep -E 'crc32|xxhash|blake2|sha256|libcrc' <<< "$extra" | while read -r f; do
        mkdir -p "$st/lib/modules/$kver/$(dirname "$f")"; cp "$md/$f" "$st/lib/modules/$kver/$f"
    done
    cp "$here/init" "$st/init" && chmod 755 "$st/init"
    printf 'root:x:0:0::/:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n' > "$st/etc-passwd"
    mkdir -p "$st/etc" && mv "$st/etc-passwd" "$st/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' > "$st/etc/group"
    (cd "$st" && find . | cpio -o -H newc --quiet | gzip -1) > "$ir.tmp" && mv "$ir.tmp" "$ir"
    rm -rf "$st"
fi

ptgt=${CARGO_TARGET_DIR:-$repo/target}-plvm
if [ "$prepare" = 1 ]; then
    (cd "$here/replay" && CARGO_TARGET_DIR=$ptgt nice cargo build -q --release) || fail "cargo build of plvm failed"
    echo "powerloss vm: prepared (kernel $kver, busybox, $ir, plvm)" >&2
    exit 0
fi

# The agent (the real one, or the mutant in a target directory of its own) and plvm.
tgt=${CARGO_TARGET_DIR:-$repo/target}
features=()
agent=$tgt/$profile/mesh-host
[ "$profile" = release ] && features+=(--release)
if [ "$mutant" = 1 ] && [ -n "${MESH_HOST_POWERLOSS_MUTANT:-}" ]; then
  # Built already (tests/run.sh builds it in the suite's own target directory).
  agent=$MESH_HOST_POWERLOSS_MUTANT
else
  if [ "$mutant" = 1 ]; then tgt=$tgt-mutant; features+=(--features powerloss-mutant); agent=$tgt/$profile/mesh-host; fi
  (cd "$repo" && CARGO_TARGET_DIR=$tgt nice cargo build -q --bin mesh-host "${features[@]}") || fail "cargo build of the agent failed"
fi
(cd "$here/replay" && CARGO_TARGET_DIR=$ptgt nice cargo build -q --release) || fail "cargo build of plvm failed"

work=$tb/run-$$
rm -rf "$work" && mkdir -p "$work/p/bin" "$work/p/lib" "$work/p/w"
trap 'rm -rf "$work"' EXIT
strip -o "$work/p/bin/mesh-host" "$agent"
cp "$ptgt/release/plvm" "$(command -v dmsetup)" "$work/p/bin/"
for b in "$work"/p/bin/*; do
    ldd "$b" | awk '/=> \//{print $3} /^\s*\/lib64/{print $1}' | while read -r l; do cp -L "$l" "$work/p/lib/"; done
done
cp -L /lib64/ld-linux-x86-64.so.2 "$work/p/lib/"
cp "$here/guest.sh" "$work/p/guest.sh"
# The archives of the changing apply: two versions of a small tree.
for v in 1 2; do
    mkdir -p "$work/a$v/docs" && for i in 1 2 3; do echo "bundle v$v page $i" > "$work/a$v/docs/p$i.txt"; done
    [ "$v" = 2 ] && echo "new in v2" > "$work/a2/docs/new.txt" && rm "$work/a2/docs/p3.txt"
    tar -C "$work/a$v" -czf - docs | base64 -w0 > "$work/a$v.b64"
done
"$ptgt/release/plvm" gen "$work/p/w" /mnt/t "$work/a1.b64" "$work/a2.b64" "$files"
mb=$(( $(du -sm "$work/p" | cut -f1) + 64 ))
mkfs.ext4 -q -F -d "$work/p" "$work/payload.img" "${mb}M"

lane=real; [ "$mutant" = 1 ] && lane=mutant
IFS=, read -r -a fslist <<< "$fss"
for f in "${fslist[@]}"; do
    case "$f" in
        ext4) fs=ext4 opts=defaults; mkfs=(mkfs.ext4 -q -F) ;;
        ext4-noauto) fs=ext4 opts=noauto_da_alloc; mkfs=(mkfs.ext4 -q -F) ;;
        xfs) fs=xfs opts=defaults; mkfs=(mkfs.xfs -q -f) ;;
        btrfs) fs=btrfs opts=defaults; mkfs=(mkfs.btrfs -q -f) ;;
        *) fail "unknown filesystem $f (ext4, ext4-noauto, xfs, btrfs)" ;;
    esac
    rm -f "$work"/{data,log,replay,cow}.img
    truncate -s 512M "$work/data.img"
    "${mkfs[@]}" "$work/data.img" >/dev/null
    cp --sparse=always "$work/data.img" "$work/replay.img"
    truncate -s 4G "$work/log.img"
    truncate -s 1G "$work/cow.img"
    out=$work/console-$f.log
    echo "powerloss vm: $f ($lane agent, $files files, states ${states/#0/all}): booting" >&2
    timeout "${MESH_HOST_VM_TIMEOUT:-5400}" qemu-system-x86_64 -accel tcg -m 1536 -smp 1 -nographic -no-reboot \
        -kernel "$vmlinuz" -initrd "$ir" \
        -append "console=ttyS0 quiet loglevel=3 panic=-1 pl_fs=$fs pl_opts=$opts pl_states=$states" \
        -drive "file=$work/payload.img,if=virtio,format=raw,readonly=on" \
        -drive "file=$work/data.img,if=virtio,format=raw,cache=unsafe" \
        -drive "file=$work/log.img,if=virtio,format=raw,cache=unsafe" \
        -drive "file=$work/replay.img,if=virtio,format=raw,cache=unsafe" \
        -drive "file=$work/cow.img,if=virtio,format=raw,cache=unsafe" > "$out" 2>&1 </dev/null || true
    tr -d '\r' < "$out" > "$out.txt"
    grep -E '^PL(INFO|ERROR|WARN)' "$out.txt" | sed "s/^/  [$f] /" >&2 || true
    grep -E '^PLDETAIL' "$out.txt" | sort | uniq -c | sort -rn | head -8 | sed "s/^/  [$f] /" >&2 || true
    mkdir -p "$tb/logs" && cp "$out.txt" "$tb/logs/console-$f-$lane-$files.log"
    grep -q "^PLDONE fs=$fs" "$out.txt" || fail "$f: the guest did not finish (console: $tb/logs/console-$f-$lane-$files.log)"
    for wl in cold change daemon failpoint; do
        grep "^PLSTATE .* workload=$wl " "$out.txt" | awk -v f="$f" -v wl="$wl" '
            { n++; for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] += kv[2] } }
            END { failed = v["failed"] + v["unconverged"]
                  printf "powerloss: lane=vm fs=%s workload=%s states=%d torn=%d lost=%d ahead=%d other=%d drift=%d failed=%d behind=%d temps=%d journal=%d\n",
                  f, wl, n, v["torn"] + v["mountfail"], v["lost"], v["ahead"], v["drift"] + failed + v["journal"], v["drift"], failed, v["behind"], v["temps"], v["journal"] }'
    done
done
exit 0
}
