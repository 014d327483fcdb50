#!/usr/bin/env bash
# tests/peers/queue-bench/run-peer.sh PEER: run one peer job queue on the
# bench's workload (see `outbox-relay bench --peers`). The environment
# (DATABASE_URL, HOOK_URL, JOBS, CONCURRENCY) comes from the bench.
#
# Needs Node.js 18 or later with npm; installs them with apt-get when run as
# root on Debian/Ubuntu, and the pinned peer packages (package-lock.json)
# with `npm ci` on first use.
set -euo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { echo "queue-bench: $*" >&2; }
die() {
	say "$*"
	exit 1
}

known() {
	local f
	for f in "$DIR"/*.mjs; do basename "$f" .mjs; done | tr '\n' ' '
}
[ $# -eq 1 ] || die "usage: $0 PEER (one of: $(known))"
PEER=$1
[ -f "$DIR/$PEER.mjs" ] || die "unknown peer '$PEER' (known: $(known))"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		say "Node.js or npm is missing; running: apt-get install -y nodejs npm"
		DEBIAN_FRONTEND=noninteractive apt-get update -q -o DPkg::Lock::Timeout=600 >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			-o DPkg::Lock::Timeout=600 nodejs npm >&2
	fi
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
