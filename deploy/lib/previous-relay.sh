# shellcheck shell=bash
# deploy/lib/previous-relay.sh: the previous version of outbox-relay, which
# the rolling-upgrade test (tests/it/upgrade.rs) runs beside this one.
# Sourced after scratch-pg.sh (say).
#
#   previous_relay_ensure   sets OUTBOX_TEST_PREVIOUS_RELAY to the binary built
#                           from PREVIOUS_RELAY_COMMIT, building it once per
#                           machine when it is missing; on failure sets
#                           OUTBOX_TEST_PREVIOUS_RELAY=unavailable:<reason> so
#                           that the test fails saying why
#
# The commit is checked out in a temporary git worktree of this repository
# and built there (`cargo build --locked`, a few minutes on two cores, in a
# target directory of its own that is removed afterwards); the binary is kept
# in ${OUTBOX_TOOLS_DIR:-$HOME/.cache/outbox-relay/tools}/outbox-relay-<commit>
# and reused by every clone. The worktree is removed again. A shallow clone
# lacks the commit: the test then says so.

# The last commit before the kafka kind: a relay that does not know it.
PREVIOUS_RELAY_COMMIT=cd4231e76aec89edbd6bdaebd560964a51109d7a

previous_relay_root() {
	echo "${OUTBOX_TOOLS_DIR:-${HOME:-/root}/.cache/outbox-relay/tools}/outbox-relay-${PREVIOUS_RELAY_COMMIT:0:12}"
}

previous_relay_ensure() {
	local root bin log worktree
	if [ -n "${OUTBOX_TEST_PREVIOUS_RELAY:-}" ] && [ -x "$OUTBOX_TEST_PREVIOUS_RELAY" ]; then
		say "previous relay: $OUTBOX_TEST_PREVIOUS_RELAY"
		return 0
	fi
	root=$(previous_relay_root)
	bin="$root/outbox-relay"
	if [ ! -x "$bin" ]; then
		if ! git -C "$REPO_ROOT" cat-file -e "$PREVIOUS_RELAY_COMMIT^{commit}" 2>/dev/null; then
			export OUTBOX_TEST_PREVIOUS_RELAY="unavailable:commit $PREVIOUS_RELAY_COMMIT is not in this clone (a shallow clone? git fetch --unshallow)"
			say "warning: the previous relay's commit is not in this clone; the upgrade test will say so"
			return 0
		fi
		mkdir -p "$root" || {
			export OUTBOX_TEST_PREVIOUS_RELAY="unavailable:cannot create $root"
			return 0
		}
		log="$root/build.log"
		say "the rolling-upgrade test needs the previous relay (commit ${PREVIOUS_RELAY_COMMIT:0:12}); building it once for this machine:"
		say "running: git worktree add --detach <tmp> ${PREVIOUS_RELAY_COMMIT:0:12} && cargo build --locked --bin outbox-relay (a few minutes; log: $log)"
		(
			# one build at a time; a second caller waits for the first
			flock 9
			[ -x "$bin" ] && exit 0
			worktree=$(mktemp -d "${TMPDIR:-/tmp}/outbox-relay-previous.XXXXXX")
			trap 'git -C "$REPO_ROOT" worktree remove --force "$worktree" >/dev/null 2>&1; rm -rf "$worktree" "$root/build"' EXIT
			git -C "$REPO_ROOT" worktree add --detach "$worktree" "$PREVIOUS_RELAY_COMMIT" >"$log" 2>&1 || exit 1
			(cd "$worktree" && CARGO_TARGET_DIR="$root/build" CARGO_PROFILE_DEV_DEBUG=0 cargo build --locked --bin outbox-relay) >>"$log" 2>&1 || exit 1
			cp "$root/build/debug/outbox-relay" "$bin.partial" && mv "$bin.partial" "$bin"
		) 9>"$root/.lock"
	fi
	if [ -x "$bin" ]; then
		export OUTBOX_TEST_PREVIOUS_RELAY="$bin"
		say "previous relay: $bin"
	else
		export OUTBOX_TEST_PREVIOUS_RELAY="unavailable:building the previous relay failed (see $root/build.log)"
		say "warning: building the previous relay failed (see $root/build.log); the upgrade test will say so"
	fi
}
