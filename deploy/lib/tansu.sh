# shellcheck shell=bash
# deploy/lib/tansu.sh: the Kafka-API broker the kafka kind's tests run
# against (Tansu, an Apache-Kafka-compatible broker written in Rust, from
# crates.io). Sourced after scratch-pg.sh (say).
#
#   tansu_ensure   sets OUTBOX_TEST_TANSU to the broker's binary, installing
#                  it once per machine when it is missing; on failure sets
#                  OUTBOX_TEST_TANSU=unavailable:<reason> so that the kafka
#                  tests fail saying why
#
# The build takes about ten minutes on two cores, so it is installed once per
# machine, outside the checkout, and reused by every clone:
# ${OUTBOX_TOOLS_DIR:-$HOME/.cache/outbox-relay/tools}/tansu-$TANSU_VERSION.
# It needs a storage engine feature to store anything: `dynostore` (the
# memory:// engine the tests use). A lock keeps two installs from racing.

TANSU_VERSION=0.6.0

tansu_root() {
	echo "${OUTBOX_TOOLS_DIR:-${HOME:-/root}/.cache/outbox-relay/tools}/tansu-$TANSU_VERSION"
}

tansu_ensure() {
	local root bin log
	if [ -n "${OUTBOX_TEST_TANSU:-}" ] && [ -x "$OUTBOX_TEST_TANSU" ]; then
		say "Kafka-API test broker: $OUTBOX_TEST_TANSU"
		return 0
	fi
	root=$(tansu_root)
	bin="$root/bin/tansu"
	if [ ! -x "$bin" ]; then
		mkdir -p "$root" || {
			export OUTBOX_TEST_TANSU="unavailable:cannot create $root"
			return 0
		}
		log="$root/install.log"
		say "the kafka tests need Tansu $TANSU_VERSION (a Kafka-API broker); installing it once for this machine:"
		say "running: cargo install tansu --version $TANSU_VERSION --locked --features dynostore --root $root (about 10 minutes on 2 cores; log: $log)"
		(
			# one install at a time; a second caller waits for the first
			flock 9
			[ -x "$bin" ] && exit 0
			CARGO_TARGET_DIR="$root/build" cargo install tansu --version "$TANSU_VERSION" \
				--locked --features dynostore --root "$root" >"$log" 2>&1 || exit 1
			rm -rf "$root/build"
		) 9>"$root/.lock"
	fi
	if [ -x "$bin" ]; then
		export OUTBOX_TEST_TANSU="$bin"
		say "Kafka-API test broker: $bin"
	else
		export OUTBOX_TEST_TANSU="unavailable:cargo install tansu failed (see $root/install.log)"
		say "warning: installing Tansu failed (see $root/install.log); the kafka tests will say so"
	fi
}
