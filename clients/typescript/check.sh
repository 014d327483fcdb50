#!/usr/bin/env bash
# clients/typescript/check.sh: the TypeScript client's checks, no installs.
#
#   DATABASE_URL=postgres://…/a_migrated_db OUTBOX_RELAY_BIN=target/debug/outbox-relay \
#     clients/typescript/check.sh
#
# 1. the lint: prettier --check (the formatting) of the sources, the tests
#    and the configuration;
# 2. the strict type-check of the sources and the tests (tsc --noEmit, with
#    the compiler's unused-code and implicit-return checks on);
# 3. the build (tsc: dist/, build output, ignored by git);
# 4. the tests (node --test, one file at a time) against that database and
#    the real relay: business tables of their own, webhooks to receivers on
#    127.0.0.1, `outbox-relay run --once` to deliver.
# Run clients/typescript/setup.sh first. Test output is also written to
# target/clients/typescript-test.txt.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HERE/../.." && pwd)
say() { printf 'clients/typescript/check.sh: %s\n' "$*" >&2; }
die() {
	say "error: $*"
	exit 1
}

[ -n "${DATABASE_URL:-}" ] || die "DATABASE_URL must name a migrated database"
[ -x "${OUTBOX_RELAY_BIN:-}" ] || die "OUTBOX_RELAY_BIN must be the outbox-relay binary (got '${OUTBOX_RELAY_BIN:-}')"
OUTBOX_RELAY_BIN=$(cd "$(dirname "$OUTBOX_RELAY_BIN")" && pwd)/$(basename "$OUTBOX_RELAY_BIN")
export DATABASE_URL OUTBOX_RELAY_BIN
cd "$HERE"
# shellcheck source=clients/typescript/node.sh
. "$HERE/node.sh"
use_private_node
node_is_recent || die "the tests need Node.js 20.10 or later ($(node --version 2>/dev/null || echo 'no node')): run clients/typescript/setup.sh"
{ [ -f node_modules/.outbox-relay-lock ] && cmp -s package-lock.json node_modules/.outbox-relay-lock; } ||
	die "the private environment is missing or stale: run clients/typescript/setup.sh"

say "lint: prettier --check"
node_modules/.bin/prettier --check --log-level warn .
say "type-check (strict): tsc --noEmit"
node_modules/.bin/tsc -p tsconfig.json --noEmit
say "build: tsc"
rm -rf dist
node_modules/.bin/tsc -p tsconfig.json
say "tests: node --test"
mkdir -p "$REPO_ROOT/target/clients"
status=0
node --enable-source-maps --test --test-concurrency=1 dist/test/*.test.js 2>&1 |
	tee "$REPO_ROOT/target/clients/typescript-test.txt" || status=$?
exit "$status"
