#!/bin/sh
# emulated.sh ARCH COMMAND [ARG...]
#
# Runs COMMAND where programs built for ARCH (aarch64, x86_64) run under qemu-user, as on a
# machine of that architecture: in a user, mount and pid namespace of its own (every id mapped
# to itself, so files keep their owners) with a binfmt_misc instance of its own (Linux 6.7 and
# later), in which qemu-ARCH-static is registered with the F flag (opened here, so it runs
# inside a chroot too). Nothing is registered on the machine: the registration ends with the
# namespace, and so does every process COMMAND started (killed with the pid namespace's
# init when this script is ended by a signal). Used by xtask to make an arm64 Debian root (mmdebstrap) and by the
# package tests to install into it; COMMAND's exit status is this script's.
set -eu

if [ "${1:-}" = --inside ]; then
    # The namespace's side: once the outside says the ids are mapped, register, run.
    shift
    arch=$1 qemu=$2 outside=$3 work=$4
    shift 4
    answer=
    read -r answer < "$work/mapped" || true
    [ "$answer" = mapped ] || exit 2
    if [ "$(readlink /proc/self/ns/user)" = "$outside" ]; then
        echo "emulated.sh: --inside is for the script's own namespace" >&2
        exit 2
    fi
    # The instance is the user namespace's wherever it is mounted: on a directory of the
    # script's own, never on the machine's /proc/sys/fs/binfmt_misc (an automount on
    # systemd hosts).
    mount -t binfmt_misc binfmt_misc "$work/binfmt" || {
        echo "emulated.sh: cannot mount a binfmt_misc of a user namespace's own (Linux 6.7+)" >&2
        exit 2
    }
    # 64-bit little-endian ELF executables (ET_EXEC or ET_DYN) of the machine ARCH names;
    # the kernel decodes the \x escapes itself.
    case $arch in
        aarch64) machine='\xb7\x00' ;;
        x86_64) machine='\x3e\x00' ;;
    esac
    magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00'$machine
    mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
    printf '%s' ":reaper-$arch:M::$magic:$mask:$qemu:F" > "$work/binfmt/register"
    exec 3>&-
    exec "$@"
fi

arch=${1:?usage: emulated.sh ARCH COMMAND [ARG...]}
shift
case $arch in
    aarch64 | x86_64) ;;
    *) echo "emulated.sh: no emulation for $arch (aarch64, x86_64)" >&2; exit 2 ;;
esac
if [ "$(uname -m)" = "$arch" ]; then
    exec "$@"
fi
qemu=$(command -v "qemu-$arch-static") || {
    echo "emulated.sh: no qemu-$arch-static (Debian's qemu-user-static)" >&2
    exit 2
}
work=$(mktemp -d)
mkdir "$work/binfmt"
mkfifo "$work/mapped"
# Opened for reading and writing, it never blocks here: the word waits in it for the inside.
exec 3<> "$work/mapped"
ours=$(readlink /proc/self/ns/user)
unshare --user --mount --pid --fork -- \
    sh "$0" --inside "$arch" "$qemu" "$ours" "$work" "$@" &
child=$!
# Killing the pid namespace's init (unshare's child) kills every process in it.
end() {
    for init in $(pgrep -P "$child"); do
        kill -KILL "$init" 2>/dev/null || true
    done
    kill -KILL "$child" 2>/dev/null || true
    rm -rf "$work"
}
trap 'end; exit 130' INT TERM
# The ids are mapped from here, once unshare is in its user namespace (root may map them
# all); the inside waits on the FIFO until told.
while [ "$(readlink "/proc/$child/ns/user" 2>/dev/null || echo "$ours")" = "$ours" ]; do
    kill -0 "$child" 2>/dev/null || break
    sleep 0.01
done
if kill -0 "$child" 2>/dev/null &&
    echo '0 0 4294967295' > "/proc/$child/uid_map" &&
    echo '0 0 4294967295' > "/proc/$child/gid_map"; then
    echo mapped >&3
else
    echo "emulated.sh: cannot map the namespace's ids (run as root)" >&2
    end
    exit 2
fi
status=0
wait "$child" || status=$?
rm -rf "$work"
exit "$status"
