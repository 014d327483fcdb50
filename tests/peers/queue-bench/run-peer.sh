#!/usr/bin/env bash
# tests/peers/queue-bench/run-peer.sh [--prepare | --sweep] PEER: run one
# peer job queue on the bench's workload (see `outbox-relay-bench --peers`).
# The environment (DATABASE_URL, HOOK_URL, JOBS, CONCURRENCY, MODE and the
# peer's knobs) comes from the bench. With --prepare it only installs and
# checks what PEER needs (the bench does this before measuring anything);
# with --sweep it prints the settings of PEER's knobs the bench tries, one
# JSON object of environment variables per line.
#
# A Node.js peer (PEER.mjs) needs Node.js 18 or later (pg-boss: 20) with
# npm; a Python peer (PEER-peer.py) needs Python 3.10 or later with venv.
# Both are installed with apt-get when missing and run as root on
# Debian/Ubuntu; the pinned peer packages (package-lock.json,
# requirements.txt) are installed on first use, the Python ones into a
# virtualenv under ~/.cache/outbox-relay.
set -euo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { echo "queue-bench: $*" >&2; }
die() {
	say "$*"
	exit 1
}

known() {
	local f
	for f in "$DIR"/*.mjs "$DIR"/*-peer.py; do
		f=$(basename "$f")
		f=${f%.mjs}
		echo "${f%-peer.py}"
	done | tr '\n' ' '
}

PREPARE=0
SWEEP=()
if [ "${1:-}" = --prepare ]; then
	PREPARE=1
	shift
elif [ "${1:-}" = --sweep ]; then
	SWEEP=(--sweep)
	shift
fi
[ $# -eq 1 ] || die "usage: $0 [--prepare | --sweep] PEER (one of: $(known))"
PEER=$1

apt_install() {
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		say "running: apt-get install -y $*"
		DEBIAN_FRONTEND=noninteractive apt-get update -q -o DPkg::Lock::Timeout=600 >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			-o DPkg::Lock::Timeout=600 "$@" >&2
	fi
}

prepare_python() {
	if ! python3 -c 'import ensurepip' 2>/dev/null; then
		apt_install python3 python3-venv || true
	fi
	python3 -c 'import ensurepip' 2>/dev/null ||
		die "the $PEER peer needs python3 with the venv module (Debian/Ubuntu: apt-get install python3-venv)"
	python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
		die "the $PEER peer needs Python 3.10 or later; this is $(python3 --version 2>&1)"
	VENV=${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/queue-bench-venv
	local stamp
	stamp="$(python3 --version 2>&1) $(cat "$DIR/requirements.txt")"
	if [ "$(cat "$VENV/installed" 2>/dev/null)" != "$stamp" ] || ! "$VENV/bin/python" -c '' 2>/dev/null; then
		say "installing $(tr '\n' ' ' <"$DIR/requirements.txt")into $VENV"
		python3 -m venv --clear "$VENV" >&2 || die "cannot create $VENV"
		"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
			-r "$DIR/requirements.txt" >&2 || die "pip install failed"
		echo "$stamp" >"$VENV/installed"
	fi
}

prepare_node() {
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
		say "Node.js or npm is missing"
		apt_install nodejs npm || true
		if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
			die "the $PEER peer needs Node.js 18 or later and npm (Debian/Ubuntu: apt-get install nodejs npm)"
		fi
	fi
	local major need=18
	[ "$PEER" = pg-boss ] && need=20
	major=$(node -p 'process.versions.node.split(".")[0]')
	[ "$major" -ge "$need" ] || die "Node.js $(node --version) is too old for the $PEER peer: it needs $need or later"
	# the pinned versions, once (again when the lock file changes)
	if [ ! -f "$DIR/node_modules/.package-lock.json" ] || [ "$DIR/package-lock.json" -nt "$DIR/node_modules/.package-lock.json" ]; then
		say "installing the peer packages (npm ci)"
		(cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error >&2) || die "npm ci failed in $DIR"
	fi
}

if [ -f "$DIR/$PEER-peer.py" ]; then
	# the module is named *-peer.py so that it does not shadow the package
	prepare_python
	[ "$PREPARE" = 1 ] && exit 0
	exec "$VENV/bin/python" "$DIR/$PEER-peer.py" ${SWEEP[@]+"${SWEEP[@]}"}
elif [ -f "$DIR/$PEER.mjs" ]; then
	prepare_node
	[ "$PREPARE" = 1 ] && exit 0
	exec node "$DIR/$PEER.mjs" ${SWEEP[@]+"${SWEEP[@]}"}
fi
die "unknown peer '$PEER' (known: $(known))"
