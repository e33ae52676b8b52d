#!/bin/sh
# Builds the microvm provider's guest image from Debian packages: a kernel, a minimal
# userspace, PostgreSQL 15 and the channel mux (sandpit-mux, Perl), with no network device
# configured. Output, in OUT_DIR: vmlinuz, initrd.img, root.qcow2, packages.txt.
#
# Usage: microvm-image.sh OUT_DIR [MIRROR]
# Needs root, debootstrap, e2fsprogs (mkfs.ext4 -d), qemu-img. The provider runs this
# with OUT_DIR named by the hash of this file, so a changed recipe makes a new image.
set -eu
out=$1
mirror=${2:-http://deb.debian.org/debian}
suite=bookworm
here=$(cd "$(dirname "$0")" && pwd)
work="$out.work.$$"
rm -rf "$work"
mkdir -p "$work"
root="$work/root"

# minbase + what the guest needs; the cloud kernel has the virtio drivers a VM needs and
# fewer modules than the generic one.
timeout 1200 debootstrap --variant=minbase \
  --include=linux-image-cloud-amd64,initramfs-tools,kmod,postgresql-15,procps \
  "$suite" "$root" "$mirror"

# The package postinst made a cluster and may have left a server running in the chroot.
for pid in $(ls /proc | grep -E '^[0-9]+$'); do
  if [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$(readlink -f "$root")" ]; then
    kill "$pid" 2>/dev/null || true
  fi
done
rm -rf "$root/var/lib/postgresql/15/main" "$root/etc/postgresql/15/main"
pgdata=/var/lib/postgresql/15/main
chroot "$root" setpriv --reuid=postgres --regid=postgres --init-groups \
  /usr/lib/postgresql/15/bin/initdb -D "$pgdata" -U sandpit_admin --auth=trust \
  --encoding=UTF8 --locale=C.UTF-8 >/dev/null
# Only the unix socket inside the guest: the host reaches it through the mux.
cat >>"$root$pgdata/postgresql.conf" <<'EOF'
listen_addresses = ''
unix_socket_directories = '/run/postgresql'
shared_buffers = 32MB
max_connections = 40
fsync = on
EOF

install -m 0755 "$here/microvm-guest/sandpit-init" "$root/sbin/sandpit-init"
install -m 0755 "$here/microvm-guest/sandpit-mux" "$root/usr/local/sbin/sandpit-mux"
# No network configuration at all; the VM is started without a network device.
echo sandpit-vm >"$root/etc/hostname"

chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' >"$work/packages.txt"
kver=$(ls "$root/lib/modules" | head -n1)
cp "$root/boot/vmlinuz-$kver" "$work/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$work/initrd.img"
grep -E '^CONFIG_(VMGENID|VIRTIO_CONSOLE|VIRTIO_BLK|EXT4_FS)=' "$root/boot/config-$kver" \
  >"$work/kernel-config.txt" || true
rm -rf "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/* "$root/boot"/*
mkfs.ext4 -q -F -L sandpit -d "$root" "$work/root.img" 2G
qemu-img convert -O qcow2 "$work/root.img" "$work/root.qcow2"
rm -f "$work/root.img"
rm -rf "$root"
# Whole or not at all: the provider uses OUT_DIR only once it exists.
rm -rf "$out"
mv "$work" "$out"
echo "image built in $out"
