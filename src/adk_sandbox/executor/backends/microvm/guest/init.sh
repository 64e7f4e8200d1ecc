#!/bin/busybox sh
# adk-sandbox microVM, first stage (/init of the initramfs; busybox only).
# Loads the virtio modules, mounts the read-only root (virtio-blk /dev/vda, ext4), puts tmpfs on /tmp, HOME
# and /run, and switches to it with vminit as PID 1. Settings come from the kernel command line:
#   adk.ports=N adk.memory=MiB adk.pids=N adk.tmpfs=MiB [adk.share=<hex of an absolute path>]
# With adk.share, the host's workspace (virtiofs tag "workspace") is mounted at that path: the root is then
# an overlay of the disk and a tmpfs (so the mount point can be made anywhere), read-only again once made.
# Anything failing here powers the VM off (the host sees QEMU exit and reports the console's last lines).
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# As on a host: an allocation larger than the VM's memory is granted and the cgroup's OOM killer decides
# when it is touched (the heuristic would refuse it with ENOMEM, unlike in a container).
echo 1 >/proc/sys/vm/overcommit_memory
fail() { echo "adk-vm-init: $*" >/dev/console; poweroff -f; }
ports=1 memory=0 pids=max tmpfs=64
for word in $(cat /proc/cmdline); do
    case $word in
        adk.ports=*) ports=${word#adk.ports=} ;;
        adk.memory=*) memory=${word#adk.memory=} ;;
        adk.pids=*) pids=${word#adk.pids=} ;;
        adk.tmpfs=*) tmpfs=${word#adk.tmpfs=} ;;
        adk.share=*) share=${word#adk.share=} ;;
    esac
done
modules="virtio_mmio virtio_blk virtio_console"
[ -n "$share" ] && modules="$modules overlay virtiofs"
for m in $modules; do modprobe "$m" || fail "modprobe $m failed"; done
i=0
while [ ! -b /dev/vda ]; do
    i=$((i + 1)); [ $i -gt 500 ] && fail "no root disk (/dev/vda)"; usleep 10000
done
if [ -z "$share" ]; then
    mount -t ext4 -o ro,noload /dev/vda /newroot || fail "cannot mount the root disk"
else
    mkdir -p /lower /upper
    mount -t ext4 -o ro,noload /dev/vda /lower || fail "cannot mount the root disk"
    mount -t tmpfs -o size=1m,mode=755 tmpfs /upper && mkdir /upper/u /upper/w || fail "no tmpfs for the root"
    mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /newroot ||
        fail "cannot mount the root overlay"
fi
opts="rw,exec,nosuid,nodev,size=${tmpfs}m,mode=1777"
mount -t tmpfs -o "$opts" tmpfs /newroot/tmp || fail "cannot mount /tmp"
mount -t tmpfs -o "$opts" tmpfs /newroot/home/sandbox || fail "cannot mount HOME (/home/sandbox)"
mount -t tmpfs -o rw,nosuid,nodev,size=16m,mode=755 tmpfs /newroot/run || fail "cannot mount /run"
mkdir -p /newroot/run/adk-vm && cp /vminit /newroot/run/adk-vm/vminit || fail "cannot place vminit"
if [ -n "$share" ]; then
    # Each byte as \xHH: printf makes the path (no word of the command line can hold every path).
    at=$(printf "$(echo "$share" | sed 's/../\\x&/g')")
    mkdir -p "/newroot$at" || fail "cannot make the workspace's mount point $at"
    mount -t virtiofs -o nosuid,nodev workspace "/newroot$at" || fail "cannot mount the workspace at $at"
    mount -o remount,ro /newroot || fail "cannot make the root read-only again"
fi
# The ports are /dev/vport<device>p<n> (device: the virtio device's index): vminit opens /dev/adk-port<n>.
n=1
while [ $n -le "$ports" ]; do
    i=0
    while ! ls /dev/vport*p$n >/dev/null 2>&1; do
        i=$((i + 1)); [ $i -gt 500 ] && fail "no virtio-serial port $n"; usleep 10000
    done
    ln -s "$(ls /dev/vport*p$n)" "/dev/adk-port$n"
    n=$((n + 1))
done
# The port after them is the seed port (vminit's seed loop): fresh randomness for a fork.
i=0
while ! ls /dev/vport*p$n >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -gt 500 ] && fail "no seed port ($n)"; usleep 10000
done
ln -s "$(ls /dev/vport*p$n)" /dev/adk-seed
# Loopback only (there is no other device): the agent's proxy for a NetworkPolicy listens on 127.0.0.1.
ifconfig lo 127.0.0.1 up || fail "cannot bring lo up"
mount --move /dev /newroot/dev
# Terminals (session.open_pty): /dev/ptmx of devtmpfs opens the devpts mounted beside it.
mkdir -p /newroot/dev/pts && mount -t devpts -o nosuid,noexec,mode=0620,ptmxmode=0666 devpts /newroot/dev/pts ||
    fail "cannot mount /dev/pts"
mkdir -p /newroot/dev/shm && mount -t tmpfs -o "$opts" tmpfs /newroot/dev/shm
mount --move /sys /newroot/sys
mount --move /proc /newroot/proc
exec switch_root /newroot /run/adk-vm/vminit "$ports" "$memory" "$pids"
