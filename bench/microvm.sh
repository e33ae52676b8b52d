#!/usr/bin/env bash
# The microvm provider beside instance in one run: fork (snapshot restore) to first query
# (median, p99), 20 backends forked at once, idle PSS per backend. Printed, not asserted.
# Needs root (the guest image is built with debootstrap on first use, ~3 min, cached in
# $SANDPIT_MICROVM_IMAGE_DIR, default /var/tmp/sandpit-microvm-images) and QEMU.
# Usage: bench/microvm.sh [--quick]   (uses target/release/sandpit if built, else debug)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/sandpit
[ -x "$bin" ] || bin=target/debug/sandpit
[ -x "$bin" ] || { echo "build sandpit first (cargo build)" >&2; exit 1; }
exec python3 bench/lib/microvm_bench.py "$(realpath "$bin")" "$@"
