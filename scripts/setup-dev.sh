#!/usr/bin/env bash
# Installs what `cargo test` needs on Debian 12 (bookworm): a Rust toolchain new enough for
# Cargo.lock, PostgreSQL, the client matrix's pinned Python and Node packages, Debian's pgjdbc
# with a JDK and pgx v4 with Go, Chromium, QEMU from bookworm-backports, debootstrap, e2fsprogs,
# xfsprogs and PgBouncer (the benchmark's baseline).
#
#   bash scripts/setup-dev.sh           install what is missing (root, or sudo for apt)
#   bash scripts/setup-dev.sh --check   install nothing: list what is missing, exit 1 if any
#
# Idempotent: every step checks first and does nothing when its part is already there, so a
# second run changes nothing. Side effects beyond installing packages, all named here:
# - When it installs postgresql, Debian's "main" cluster is not created (createcluster.d).
# - bookworm-backports is added to apt's sources (one file, only when no source names it and
#   QEMU >= 10 is missing). Backports are never upgraded to by default (apt pins them at 100);
#   only the package asked for with -t comes from there.
# - Debian's pgbouncer package would start a PgBouncer service on 127.0.0.1:6432 (the
#   gateway's default port). When this script installs it, the package is kept from starting
#   it and its start at boot is disabled; a pgbouncer that was there before is left alone.
# - Python packages go into the `python3` the tests run (PATH; tests/agent/clients.rs also honours
#   SANDPIT_PYTHON), with --break-system-packages where PEP 668 refuses otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

check_only=false
case "${1:-}" in
  --check) check_only=true ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

missing=()
say() { echo "setup-dev: $*"; }

# Marks a part missing under --check; otherwise runs its installer.
need() {
  local what=$1
  shift
  if $check_only; then
    missing+=("$what")
  else
    say "installing $what"
    "$@"
  fi
}

as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "setup-dev: needs root for: $* (run as root or install sudo)" >&2
    exit 1
  fi
}

apt_updated=false
apt_install() {
  if ! $apt_updated; then
    as_root apt-get update -qq
    apt_updated=true
  fi
  as_root apt-get install -y -qq --no-install-recommends "$@"
}

is_bookworm() { grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; }

# --- Debian packages ----------------------------------------------------------------------
debs=()
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || debs+=(postgresql)
command -v psql >/dev/null 2>&1 || debs+=(postgresql-client)
# The Rust crates (ring) compile C; cargo links with cc.
command -v cc >/dev/null 2>&1 || debs+=(gcc libc6-dev)
command -v curl >/dev/null 2>&1 || debs+=(curl ca-certificates)
command -v git >/dev/null 2>&1 || debs+=(git)
# Headless Chromium renders the review page (tests/review/diffs.rs, tests/review/review_page.rs).
command -v chromium >/dev/null 2>&1 || debs+=(chromium)
command -v python3 >/dev/null 2>&1 || debs+=(python3)
python3 -m pip --version >/dev/null 2>&1 || debs+=(python3-pip)
command -v npm >/dev/null 2>&1 || debs+=(nodejs npm)
# The SDK test (tests/operator/sdk.rs) installs clients/python into a clean virtualenv.
venv_probe=$(mktemp -d)
python3 -m venv "$venv_probe/v" >/dev/null 2>&1 || debs+=(python3-venv)
rm -rf "$venv_probe"
# XFS for the benchmark's reflink fork; debootstrap and mkfs.ext4 -d build the microvm guest.
command -v mkfs.xfs >/dev/null 2>&1 || debs+=(xfsprogs)
command -v mkfs.ext4 >/dev/null 2>&1 || debs+=(e2fsprogs)
command -v debootstrap >/dev/null 2>&1 || debs+=(debootstrap)
command -v qemu-img >/dev/null 2>&1 || debs+=(qemu-utils)
# pgjdbc, the client matrix's Java column (tests/clients/jdbc/Scenario.java), and javac for it.
command -v javac >/dev/null 2>&1 || debs+=(default-jdk-headless)
[ -e /usr/share/java/postgresql.jar ] || debs+=(libpostgresql-jdbc-java)
# pgx v4 and Go for it (tests/clients/pgx/main.go), built from Debian's sources in GOPATH mode.
command -v go >/dev/null 2>&1 || debs+=(golang-go)
[ -d /usr/share/gocode/src/github.com/jackc/pgx/v4 ] || debs+=(golang-github-jackc-pgx-v4-dev)
install_debs() {
  # Debian's postgresql would create and start a "main" cluster on port 5432; the tests and
  # the gateway start servers of their own. Only when the package is installed now.
  if [[ " $* " == *" postgresql "* ]] && [ ! -e /etc/postgresql-common/createcluster.conf ]; then
    as_root mkdir -p /etc/postgresql-common/createcluster.d
    echo 'create_main_cluster = false' |
      as_root tee /etc/postgresql-common/createcluster.d/sandpit.conf >/dev/null
  fi
  apt_install "$@"
}
if [ "${#debs[@]}" -gt 0 ]; then
  need "Debian packages: ${debs[*]}" install_debs "${debs[@]}"
fi

# PgBouncer: install it without leaving Debian's service on the gateway's port. A policy-rc.d
# (only if none exists) keeps the package from starting it at all; its start at boot is
# disabled. Both only here, for the pgbouncer installed now: one that was there is left alone.
install_pgbouncer() {
  local policy=/usr/sbin/policy-rc.d made=false rc=0
  if [ ! -e "$policy" ]; then
    printf '%s\n' '#!/bin/sh' '# scripts/setup-dev.sh: pgbouncer is not started while it installs' \
      'for a in "$@"; do [ "$a" = pgbouncer ] && exit 101; done' 'exit 0' |
      as_root tee "$policy" >/dev/null
    as_root chmod 755 "$policy"
    made=true
  fi
  apt_install pgbouncer || rc=$?
  if $made; then as_root rm -f "$policy"; fi
  [ "$rc" = 0 ] || return "$rc"
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    as_root systemctl disable --now pgbouncer >/dev/null 2>&1 || true
  else
    # A policy-rc.d that was there before may have let it start.
    $made || as_root service pgbouncer stop >/dev/null 2>&1 || true
    as_root update-rc.d pgbouncer disable >/dev/null 2>&1 || true
    # The unit the package enabled, for a later boot with systemd.
    as_root systemctl disable pgbouncer >/dev/null 2>&1 || true
  fi
}
command -v pgbouncer >/dev/null 2>&1 || need "pgbouncer" install_pgbouncer

# QEMU >= 10 (migration to a file with x-ignore-shared, memory-backend-file readonly=on,rom=off;
# bookworm's 7.2 lacks them): from bookworm-backports on Debian 12.
qemu_major() {
  qemu-system-x86_64 --version 2>/dev/null | sed -n 's/.*version \([0-9]*\)\..*/\1/p' | head -1
}
install_qemu() {
  if is_bookworm; then
    if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
      echo 'deb http://deb.debian.org/debian bookworm-backports main' |
        as_root tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null
      apt_updated=false
    fi
    apt_install -t bookworm-backports qemu-system-x86
  else
    apt_install qemu-system-x86
  fi
}
[ "$(qemu_major)" -ge 10 ] 2>/dev/null || need "QEMU >= 10 (qemu-system-x86)" install_qemu

# --- Rust ---------------------------------------------------------------------------------
# Cargo.toml's rust-version: the oldest toolchain the locked crates build with. Debian 12's
# rustc is 1.63 and its rustc-web 1.85, both older: rustup's stable toolchain it is.
min_rust=$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' Cargo.toml)
[ -d "$HOME/.cargo/bin" ] && PATH="$HOME/.cargo/bin:$PATH"
rust_ok() {
  local v
  v=$(cargo --version 2>/dev/null | sed -n 's/^cargo \([0-9]*\.[0-9]*\).*/\1/p')
  [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$min_rust" "$v" | sort -V | head -1)" = "$min_rust" ]
}
install_rust() {
  if command -v rustup >/dev/null 2>&1; then
    rustup toolchain install stable --profile minimal
    rustup default stable
  elif ! curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
    sh -s -- -y --profile minimal --default-toolchain stable; then
    echo "setup-dev: could not install Rust >= $min_rust from rustup.rs (no network to" \
      "static.rust-lang.org?). Debian 12's rustc (1.63) and rustc-web (1.85) are too old for" \
      "Cargo.lock; install a toolchain >= $min_rust and run this again." >&2
    exit 1
  fi
  PATH="$HOME/.cargo/bin:$PATH"
  rust_ok || { echo "setup-dev: cargo is still older than $min_rust" >&2; exit 1; }
  say "Rust installed in ~/.cargo/bin; a new login shell has it on PATH (or: . \"\$HOME/.cargo/env\")"
}
rust_ok || need "Rust >= $min_rust (cargo)" install_rust

# --- Python packages (pinned) -------------------------------------------------------------
# psycopg's binary wheel carries libpq 18, which the protocol-3.2 negotiation test relies on;
# mcp drives `sandpit mcp` and POST /mcp (tests/agent/mcp.rs); Django and SQLAlchemy are the ORM
# steps of the psycopg scenario (tests/clients/orm_steps.py); asyncpg is a client matrix column
# (tests/clients/asyncpg_scenario.py); kubernetes-validate (and its
# PyYAML) checks docker/kubernetes/cluster against the Kubernetes schemas (tests/checks/kubernetes/).
python=${SANDPIT_PYTHON:-python3}
pip_install() {
  "$python" -m pip install --quiet "$1" ||
    "$python" -m pip install --quiet --break-system-packages "$1"
}
for pin in 'psycopg[binary]==3.3.9' 'mcp==2.3.0' 'Django==5.2.19' 'SQLAlchemy==2.1.9' \
  'asyncpg==0.32.0' 'kubernetes-validate==1.37.0'; do
  name=${pin%%==*}
  name=${name%%\[*}
  version=${pin##*==}
  if ! "$python" -c 'import importlib.metadata as m, sys; sys.exit(m.version(sys.argv[1]) != sys.argv[2])' \
    "$name" "$version" >/dev/null 2>&1; then
    need "Python $pin" pip_install "$pin"
  fi
done

# The SDK test's clean install is offline, from a wheelhouse of pinned wheels.
sdk_wheels=target/sdk-wheelhouse
if ! ls "$sdk_wheels"/psycopg-3.3.9-* "$sdk_wheels"/psycopg_binary-3.3.9-* "$sdk_wheels"/pytest-8.3.5-* \
  "$sdk_wheels"/setuptools-75.8.0-* >/dev/null 2>&1; then
  need "SDK wheelhouse ($sdk_wheels)" "$python" -m pip download --quiet --dest "$sdk_wheels" \
    'psycopg[binary]==3.3.9' pytest==8.3.5 setuptools==75.8.0
fi

# --- Node packages (lock files) -----------------------------------------------------------
# node-postgres and postgres.js for the client matrix; node-postgres for the harness example.
npm_ci() { (cd "$1" && npm ci --no-audit --no-fund --loglevel=error); }
# TypeScript for clients/typescript (the SDK), built before examples/node links it.
for dir_mods in "tests/clients/node:pg postgres" "clients/typescript:typescript" "examples/node:pg"; do
  dir=${dir_mods%%:*}
  fresh=true
  for mod in ${dir_mods#*:}; do
    [ -d "$dir/node_modules/$mod" ] || fresh=false
  done
  [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ] && fresh=false
  $fresh || need "npm ci in $dir" npm_ci "$dir"
done

# --- What no package gives ----------------------------------------------------------------
# Network namespaces and tmpfs mounts (tests/agent/e2e.rs, containment.rs, instance_provider.rs,
# disk_full.rs) need root; as another user those tests skip, or fail under CI=true.
[ "$(id -u)" = 0 ] || say "note: not root, so the tests needing namespaces and mounts will skip"

if $check_only; then
  if [ "${#missing[@]}" -gt 0 ]; then
    printf 'setup-dev: missing: %s\n' "${missing[@]}"
    exit 1
  fi
  say "everything cargo test needs is here"
else
  say "done"
fi
