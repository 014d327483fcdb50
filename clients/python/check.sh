#!/usr/bin/env bash
# clients/python/check.sh: lint, strict type-check, then test the Python client.
#
#   DATABASE_URL=postgres://.../db OUTBOX_RELAY_BIN=target/debug/outbox-relay clients/python/check.sh [PYTEST_ARGS...]
#
# DATABASE_URL names a migrated database (the tests create their own table,
# orders, in it); OUTBOX_RELAY_BIN is the relay binary the tests run with
# `run --once`. Installs nothing: the tools come from the private environment
# clients/python/setup.sh makes (target/clients/python-venv). Anything written
# goes under target/. Exits non-zero on any failure.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HERE/../.." && pwd)
VENV="$REPO_ROOT/target/clients/python-venv"
say() { printf 'clients/python/check.sh: %s\n' "$*" >&2; }
die() {
	say "error: $*"
	exit 1
}

if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.installed" ]; then
	die "the private environment $VENV is missing: run clients/python/setup.sh first"
fi
# the same fingerprint setup.sh writes: the lock and the package's metadata
[ "$(cat "$VENV/.installed")" = "$(cat "$HERE/requirements-test.lock" "$HERE/pyproject.toml" | sha256sum | cut -d' ' -f1)" ] ||
	die "$VENV was made from another requirements-test.lock or pyproject.toml: run clients/python/setup.sh"
[ -n "${DATABASE_URL:-}" ] || die "DATABASE_URL is not set (a migrated database)"
[ -n "${OUTBOX_RELAY_BIN:-}" ] || die "OUTBOX_RELAY_BIN is not set (the relay binary)"
[ -x "$OUTBOX_RELAY_BIN" ] || die "OUTBOX_RELAY_BIN=$OUTBOX_RELAY_BIN is not an executable"

cd "$HERE"
export PYTHONDONTWRITEBYTECODE=1 PYTHONPYCACHEPREFIX="$REPO_ROOT/target/clients/python-pycache"

say "ruff check"
"$VENV/bin/ruff" check --quiet
say "ruff format --check"
"$VENV/bin/ruff" format --check --quiet
say "mypy --strict (src and tests)"
"$VENV/bin/mypy" --strict
say "pytest"
"$VENV/bin/python" -m pytest -q "$@"
