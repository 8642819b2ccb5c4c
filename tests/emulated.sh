#!/bin/sh
# emulated.sh ARCH COMMAND [ARG...]
#
# Runs COMMAND where programs built for ARCH (aarch64, x86_64) run under qemu-user, as on a
# machine of that architecture: in a user namespace and a mount namespace of its own (every id
# mapped to itself, so files keep their owners) with a binfmt_misc instance of its own (Linux
# 6.7 and later), in which qemu-ARCH-static is registered with the F flag (opened here, so it
# runs inside a chroot too). Nothing is registered on the machine: the registration ends with
# the namespace. Used by xtask to make an arm64 Debian root (mmdebstrap) and by the package
# tests to install into it; COMMAND's exit status is this script's.
set -eu

if [ "${1:-}" = --inside ]; then
    # The namespace's side: wait for the ids the outside maps, register, run.
    shift
    arch=$1 qemu=$2
    shift 2
    tries=0
    until [ "$(id -u)" = 0 ]; do
        tries=$((tries + 1))
        [ "$tries" -lt 1000 ] || { echo "emulated.sh: no ids were mapped" >&2; exit 2; }
        sleep 0.01
    done
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || {
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
    printf '%s' ":reaper-$arch:M::$magic:$mask:$qemu:F" > /proc/sys/fs/binfmt_misc/register
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
unshare --user --mount --fork -- sh "$0" --inside "$arch" "$qemu" "$@" &
child=$!
trap 'kill "$child" 2>/dev/null' INT TERM
# The ids are mapped from here, once the child is in its user namespace (root may map them all).
ours=$(readlink /proc/self/ns/user)
while [ "$(readlink "/proc/$child/ns/user" 2>/dev/null || echo "$ours")" = "$ours" ]; do
    kill -0 "$child" 2>/dev/null || break
    sleep 0.01
done
if kill -0 "$child" 2>/dev/null; then
    { echo '0 0 4294967295' > "/proc/$child/uid_map" &&
        echo '0 0 4294967295' > "/proc/$child/gid_map"; } || {
        kill "$child"
        echo "emulated.sh: cannot map the namespace's ids (run as root)" >&2
        exit 2
    }
fi
status=0
wait "$child" || status=$?
exit "$status"
