#!/usr/bin/env bash
# tests/peers/queue-bench/run-peer.sh PEER: run one peer job queue on the
# bench's workload (see `outbox-relay bench --peers`). The environment
# (DATABASE_URL, HOOK_URL, JOBS, CONCURRENCY) comes from the bench.
#
# A Node.js peer (PEER.mjs) needs Node.js 18 or later with npm; a Python
# peer (PEER.py) needs python3 with venv. Both are installed with apt-get
# when missing and run as root on Debian/Ubuntu; the pinned peer packages
# (package-lock.json, requirements.txt) are installed on first use, the
# Python ones into a virtualenv under ~/.cache/outbox-relay.
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
[ $# -eq 1 ] || die "usage: $0 PEER (one of: $(known))"
PEER=$1

apt_install() {
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		say "running: apt-get install -y $*"
		DEBIAN_FRONTEND=noninteractive apt-get update -q -o DPkg::Lock::Timeout=600 >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			-o DPkg::Lock::Timeout=600 "$@" >&2
	fi
}

if [ -f "$DIR/$PEER-peer.py" ]; then
	# the module is named *-peer.py so that it does not shadow the package
	VENV=${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/queue-bench-venv
	if ! cmp -s "$DIR/requirements.txt" "$VENV/requirements.installed"; then
		if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
			apt_install python3 python3-venv || true
		fi
		python3 -c 'import ensurepip' 2>/dev/null ||
			die "the $PEER peer needs python3 with the venv module (Debian/Ubuntu: apt-get install python3-venv)"
		say "installing $(tr '\n' ' ' <"$DIR/requirements.txt")into $VENV"
		python3 -m venv --clear "$VENV" >&2 || die "cannot create $VENV"
		"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
			-r "$DIR/requirements.txt" >&2 || die "pip install failed"
		cp "$DIR/requirements.txt" "$VENV/requirements.installed"
	fi
	exec "$VENV/bin/python" "$DIR/$PEER-peer.py"
fi

[ -f "$DIR/$PEER.mjs" ] || die "unknown peer '$PEER' (known: $(known))"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	say "Node.js or npm is missing"
	apt_install nodejs npm || true
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
		die "the peer benchmark needs Node.js 18 or later and npm (Debian/Ubuntu: apt-get install nodejs npm)"
	fi
fi
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 18 ] || die "Node.js $(node --version) is too old for the peer benchmark: it needs 18 or later"

# install the pinned versions once (again when the lock file changes)
if [ ! -f "$DIR/node_modules/.package-lock.json" ] || [ "$DIR/package-lock.json" -nt "$DIR/node_modules/.package-lock.json" ]; then
	say "installing the peer packages (npm ci)"
	(cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error >&2) || die "npm ci failed in $DIR"
fi
exec node "$DIR/$PEER.mjs"
