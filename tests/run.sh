#!/usr/bin/env bash
# tests/run.sh: the project's test command.
#
#   tests/run.sh [ARGS...]   ARGS go to `cargo nextest run` (or `cargo test`)
#
# Uses $DATABASE_URL when it is set and its server answers; otherwise starts a
# scratch PostgreSQL cluster on 127.0.0.1 and removes it on exit. Starts a
# private RabbitMQ node (deploy/lib/scratch-rabbit.sh), stopped on exit, then
# runs the whole workspace suite.
#
# What it installs when missing (Debian packages only when run as root, and
# it says each install before it runs it):
#   - Debian: postgresql, rabbitmq-server, nats-server, chromium and
#     chromium-driver (the console's browser test), haproxy (the failover
#     drill), python3 and python3-venv;
#   - PyPI, into a private virtual environment under target/test-venv (never
#     into your own Python): the pinned peers of tests/peers/requirements.txt;
#   - Debian: make, pkg-config and libssl-dev (librdkafka's build, see
#     deploy/lib/build-tools.sh);
#   - crates.io: the Kafka-API test broker Tansu, built once per machine
#     into ~/.cache/outbox-relay/tools (about ten minutes on two cores; see
#     deploy/lib/tansu.sh);
#   - the previous version of the relay (a pinned commit of this
#     repository), built once per machine into ~/.cache/outbox-relay/tools
#     for the rolling-upgrade test (a few minutes; see
#     deploy/lib/previous-relay.sh);
#   - the clients' test tools: clients/python/setup.sh (PyPI, hash-checked,
#     into target/clients/python-venv) and clients/typescript/setup.sh
#     (npm ci into clients/typescript/node_modules; Debian's nodejs and npm
#     when missing).
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
# shellcheck source=deploy/lib/build-tools.sh
. "$REPO_ROOT/deploy/lib/build-tools.sh"
# shellcheck source=deploy/lib/tansu.sh
. "$REPO_ROOT/deploy/lib/tansu.sh"
# shellcheck source=deploy/lib/previous-relay.sh
. "$REPO_ROOT/deploy/lib/previous-relay.sh"

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	scratch_rabbit_stop
	scratch_pg_stop
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The Python test peers (tests/peers/requirements.txt: aiosmtpd for the email
# tests, SQLAlchemy and psycopg2 for the ORM test) live in a private virtual
# environment, target/test-venv, made with the machine's python3 (Debian's
# python3 and python3-venv are installed when missing and the script runs as
# root). Exports OUTBOX_TEST_PYTHON (the venv's interpreter) when it is
# ready, and OUTBOX_TEST_SMTP=unavailable when it cannot be.
TEST_VENV="$REPO_ROOT/target/test-venv"
PEER_REQUIREMENTS="$REPO_ROOT/tests/peers/requirements.txt"

venv_is_current() {
	[ -x "$TEST_VENV/bin/python" ] && [ -f "$TEST_VENV/.requirements" ] &&
		cmp -s "$PEER_REQUIREMENTS" "$TEST_VENV/.requirements"
}

ensure_python_peers() {
	local py out
	if venv_is_current; then
		OUTBOX_TEST_PYTHON="$TEST_VENV/bin/python"
		export OUTBOX_TEST_PYTHON
		say "Python test peers: $TEST_VENV"
		return 0
	fi
	py=$(command -v python3 || true)
	if { [ -z "$py" ] || ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; } && can_apt; then
		say "python3 or its venv module is missing; installing Debian's python3 and python3-venv"
		apt_install python3 python3-venv || true
		py=$(command -v python3 || true)
	fi
	if [ -z "$py" ]; then
		say "warning: python3 is unavailable; the email and ORM tests will say so (apt-get install python3 python3-venv)"
		export OUTBOX_TEST_SMTP=unavailable
		return 0
	fi
	say "installing the Python test peers ($(grep -Eo '^[A-Za-z0-9_.-]+==[^ ]+' "$PEER_REQUIREMENTS" | tr '\n' ' ')) into $TEST_VENV"
	rm -rf "$TEST_VENV"
	if out=$("$py" -m venv "$TEST_VENV" 2>&1) &&
		out=$(PIP_DISABLE_PIP_VERSION_CHECK=1 "$TEST_VENV/bin/python" -m pip install \
			--quiet -r "$PEER_REQUIREMENTS" 2>&1); then
		cp "$PEER_REQUIREMENTS" "$TEST_VENV/.requirements"
		OUTBOX_TEST_PYTHON="$TEST_VENV/bin/python"
		export OUTBOX_TEST_PYTHON
		say "Python test peers: $TEST_VENV"
	else
		printf '%s\n' "$out" | tail -n 3 >&2
		say "warning: the Python test peers could not be installed into $TEST_VENV;"
		say "warning: the email and ORM tests will say so"
		export OUTBOX_TEST_SMTP=unavailable
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

# HAProxy (the failover drill's stable address in front of a primary and
# its standby): Debian's haproxy, through tests/peers/haproxy.sh.
ensure_haproxy() {
	local bin
	if bin=$("$REPO_ROOT/tests/peers/haproxy.sh"); then
		say "failover test peer: $("$bin" -v 2>/dev/null | head -n 1)"
	else
		say "warning: HAProxy is unavailable; the failover drill will say so (apt-get install haproxy)"
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
ensure_build_tools

say "checking the test peers (installing what is missing: see the head of tests/run.sh)"

ensure_python_peers
say "the Python client's test tools: clients/python/setup.sh"
bash "$REPO_ROOT/clients/python/setup.sh"
say "the TypeScript client's test tools: clients/typescript/setup.sh"
bash "$REPO_ROOT/clients/typescript/setup.sh"
ensure_nats_server
ensure_chromium
ensure_haproxy
tansu_ensure
previous_relay_ensure
scratch_rabbit_setup
scratch_pg_setup pg-test
drop_leftover_test_dbs

# docs/getting-started.md runs demo-receiver, a binary of another package of
# the workspace: built here, before the suite, so that its test (which runs
# the same command, then a no-op) does not compile it while other tests run.
say "building the demo receiver: cargo build --locked -p outbox-demo-receiver"
cargo build --locked -p outbox-demo-receiver

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
