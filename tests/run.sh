#!/usr/bin/env bash
# tests/run.sh: the project's test command.
#
#   tests/run.sh [ARGS...]   ARGS go to `cargo nextest run` (or `cargo test`)
#
# Uses $DATABASE_URL when it is set and its server answers; otherwise starts a
# scratch PostgreSQL cluster on 127.0.0.1 (installing the server binaries with
# apt-get when run as root) and removes it on exit. Makes sure the SMTP test
# peer (python3 + aiosmtpd), nats-server, Chromium with ChromeDriver (the
# console's browser test) and a RabbitMQ broker (a private
# node, stopped on exit; deploy/lib/scratch-rabbit.sh) are available, then
# runs the whole workspace suite.
# The integration tests are one binary (tests/it); nextest's test groups and
# timeouts are in .config/nextest.toml.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"
LOG_PREFIX=run.sh
# shellcheck source=deploy/lib/scratch-pg.sh
. "$REPO_ROOT/deploy/lib/scratch-pg.sh"
# shellcheck source=deploy/lib/scratch-rabbit.sh
. "$REPO_ROOT/deploy/lib/scratch-rabbit.sh"

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	scratch_rabbit_stop
	scratch_pg_stop
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

py_has_aiosmtpd() { "$1" -c 'import aiosmtpd' >/dev/null 2>&1; }

# Make python3 + aiosmtpd (the SMTP peer of the email tests) available.
# Exports OUTBOX_TEST_PYTHON when a python3 exists, and
# OUTBOX_TEST_SMTP=unavailable when aiosmtpd cannot be had.
ensure_aiosmtpd() {
	local py out=""
	py=$(command -v python3 || true)
	if [ -z "$py" ] && can_apt; then
		say "python3 is missing; installing python3 and python3-aiosmtpd"
		apt_install python3 python3-aiosmtpd || true
		py=$(command -v python3 || true)
	fi
	if [ -n "$py" ] && ! py_has_aiosmtpd "$py"; then
		say "aiosmtpd is missing; running: $py -m pip install --quiet aiosmtpd"
		if ! out=$(PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet \
			--disable-pip-version-check aiosmtpd 2>&1); then
			if grep -q 'externally-managed-environment' <<<"$out"; then
				say "the Python environment is externally managed; retrying with --break-system-packages"
				out=$(PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet \
					--disable-pip-version-check --break-system-packages aiosmtpd 2>&1) || true
			fi
		fi
		if ! py_has_aiosmtpd "$py" && can_apt; then
			apt_install python3-aiosmtpd || true
			# apt serves the system python, which may not be the python3 on
			# PATH (pyenv, a virtualenv): use it when it has the module.
			if ! py_has_aiosmtpd "$py" && [ -x /usr/bin/python3 ] &&
				py_has_aiosmtpd /usr/bin/python3; then
				py=/usr/bin/python3
			fi
		fi
	fi
	if [ -n "$py" ]; then
		OUTBOX_TEST_PYTHON=$("$py" -c 'import sys; print(sys.executable)' 2>/dev/null || echo "$py")
		export OUTBOX_TEST_PYTHON
	fi
	if [ -n "$py" ] && py_has_aiosmtpd "$py"; then
		say "SMTP test peer: aiosmtpd with $OUTBOX_TEST_PYTHON"
	else
		[ -n "$out" ] && printf '%s\n' "$out" | tail -n 3 >&2
		say "warning: the SMTP test peer (python3 with aiosmtpd) is unavailable; the tests that"
		say "warning: need it will report so. Install it: pip install aiosmtpd, or apt-get install python3-aiosmtpd"
		export OUTBOX_TEST_SMTP=unavailable
	fi
}

py_has_orm() { "$1" -c 'import sqlalchemy, psycopg2' >/dev/null 2>&1; }

# Make SQLAlchemy and psycopg2 (the ORM peer of the insertable-outbox test)
# importable by $OUTBOX_TEST_PYTHON: Debian's packages when that is the
# system python, else pip. Says what is missing when it cannot.
ensure_orm_peer() {
	local py=${OUTBOX_TEST_PYTHON:-}
	[ -n "$py" ] || return 0
	py_has_orm "$py" && { say "ORM test peer: SQLAlchemy with $py"; return 0; }
	if [ "$py" = /usr/bin/python3 ] && can_apt; then
		say "SQLAlchemy is missing; installing python3-sqlalchemy and python3-psycopg2"
		apt_install python3-sqlalchemy python3-psycopg2 || true
	fi
	if ! py_has_orm "$py"; then
		say "SQLAlchemy is missing; running: $py -m pip install --quiet sqlalchemy psycopg2-binary"
		PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet --disable-pip-version-check \
			sqlalchemy psycopg2-binary >/dev/null 2>&1 ||
			PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet --disable-pip-version-check \
				--break-system-packages sqlalchemy psycopg2-binary >/dev/null 2>&1 || true
	fi
	if py_has_orm "$py"; then
		say "ORM test peer: SQLAlchemy with $py"
	else
		say "warning: SQLAlchemy or psycopg2 is unavailable for $py; the ORM test will say so."
		say "warning: install it: apt-get install python3-sqlalchemy python3-psycopg2, or pip install sqlalchemy psycopg2-binary"
	fi
}

# nats-server (the JetStream peer of the nats kind's tests; each test starts
# a private one on its own loopback port and store directory).
ensure_nats_server() {
	if ! have nats-server && can_apt; then
		say "nats-server is missing; installing Debian's nats-server"
		apt_install nats-server || true
	fi
	if have nats-server; then
		say "NATS test peer: $(nats-server --version 2>&1 | head -n 1)"
	else
		say "warning: nats-server is unavailable; the nats tests will say so (apt-get install nats-server)"
	fi
}

# Chromium and ChromeDriver (the console's browser tests drive a real
# headless Chromium over WebDriver): Debian's chromium and chromium-driver.
ensure_chromium() {
	if { ! have chromium || ! have chromedriver; } && can_apt; then
		say "chromium or chromedriver is missing; installing Debian's chromium and chromium-driver"
		apt_install chromium chromium-driver || true
	fi
	if have chromium && have chromedriver; then
		say "browser test peer: $(chromium --version 2>/dev/null | head -n 1), $(chromedriver --version 2>/dev/null | cut -d' ' -f1-2)"
	else
		say "warning: chromium and chromedriver are unavailable; the console's browser test will fail"
		say "warning: saying so. Install them: apt-get install chromium chromium-driver (as root)"
	fi
}

# Best effort: drop test databases left by runs that were killed. A database
# still in use (a concurrent run) refuses DROP and is left alone.
drop_leftover_test_dbs() {
	local psql dbs db n=0
	psql=$(find_pg_tool psql) || return 0
	dbs=$("$psql" -d "$DATABASE_URL" -XAtq -c \
		"SELECT datname FROM pg_database WHERE datname LIKE 'outbox\_test\_%'" 2>/dev/null) || return 0
	while read -r db; do
		[ -n "$db" ] || continue
		if "$psql" -d "$DATABASE_URL" -Xq -c "DROP DATABASE IF EXISTS \"$db\"" >/dev/null 2>&1; then
			n=$((n + 1))
		fi
	done <<<"$dbs"
	[ "$n" -eq 0 ] || say "dropped $n leftover test database(s)"
}

have cargo || die "cargo is not on PATH: install Rust (rustup) first"

ensure_aiosmtpd
ensure_orm_peer
ensure_nats_server
ensure_chromium
scratch_rabbit_setup
scratch_pg_setup pg-test
drop_leftover_test_dbs

if cargo nextest --version >/dev/null 2>&1; then
	# nextest does not run doctests: run them first, when no filter was given
	if [ "$#" -eq 0 ]; then
		say "running: cargo test --doc --locked --workspace"
		cargo test --doc --locked --workspace
	fi
	runner=(cargo nextest run --locked --workspace --no-fail-fast "$@")
else
	say "cargo-nextest is not installed; using cargo test"
	runner=(cargo test --locked --workspace --no-fail-fast "$@")
fi
say "running: ${runner[*]}"
status=0
"${runner[@]}" || status=$?
if [ "$status" -eq 0 ]; then
	say "tests passed"
else
	say "tests failed (exit status $status)"
fi
exit "$status"
