#!/usr/bin/env bash
# clients/python/setup.sh: the Python client's private test environment.
#
# Makes target/clients/python-venv (under the repository root) with the
# machine's python3 (3.10 or later), installs the pinned, hash-checked test
# tools of requirements-test.lock into it (pytest, pytest-asyncio, mypy,
# ruff, psycopg 3, psycopg2-binary, SQLAlchemy, Django, django-stubs,
# types-psycopg2, OpenTelemetry's API and SDK, hatchling), then this package
# itself, editable. Never touches the user's own Python. When the venv
# already holds this lock and this pyproject.toml it does nothing.
# As root, Debian's python3 and python3-venv are installed when missing.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HERE/../.." && pwd)
LOG_PREFIX=clients/python/setup.sh
# shellcheck source=deploy/lib/scratch-pg.sh
. "$REPO_ROOT/deploy/lib/scratch-pg.sh" # say, die, have, can_apt, apt_install

VENV="$REPO_ROOT/target/clients/python-venv"
LOCK="$HERE/requirements-test.lock"
STAMP="$VENV/.installed"

# What the venv was made from: the lock and the package's metadata.
fingerprint() { cat "$LOCK" "$HERE/pyproject.toml" | sha256sum | cut -d' ' -f1; }

venv_is_current() {
	[ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ]
}

if venv_is_current; then
	say "current: $VENV ($("$VENV/bin/python" --version))"
	exit 0
fi

py=$(command -v python3 || true)
if { [ -z "$py" ] || ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; } && can_apt; then
	say "python3 or its venv module is missing; installing Debian's python3 and python3-venv"
	apt_install python3 python3-venv
	py=$(command -v python3 || true)
fi
[ -n "$py" ] || die "python3 is not on PATH (apt-get install python3 python3-venv)"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
	die "$("$py" --version) is too old: the client needs Python 3.10 or later"

say "making $VENV with $("$py" --version)"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$py" -m venv "$VENV"
say "installing the pinned versions (hash-checked) of requirements-test.lock for this Python:" \
	"$(grep -Eo '^[A-Za-z0-9_.-]+' "$LOCK" | sort -u | tr '\n' ' ')"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet \
	--require-hashes --only-binary=:all: -r "$LOCK"
say "installing outbox-relay (clients/python) into it, editable"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet \
	--no-deps --no-build-isolation --editable "$HERE"
fingerprint >"$STAMP"
say "ready: $VENV"
