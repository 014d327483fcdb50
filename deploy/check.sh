#!/usr/bin/env bash
# deploy/check.sh: validate the monitoring files in deploy/.
#
#   - promtool check rules deploy/prometheus/alerts.yml
#   - promtool test rules deploy/prometheus/alerts_test.yml
#   - the Grafana dashboard is valid JSON
#   - every metric the alerts and the dashboard use is one the relay exports
#
# promtool comes from the Debian package `prometheus`, installed with apt-get
# when it is missing and we run as root; without it the promtool checks are
# skipped (said so) and the other checks still run.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"

RULES=deploy/prometheus/alerts.yml
RULES_TEST=deploy/prometheus/alerts_test.yml
DASHBOARD=deploy/grafana/outbox-relay.json

# What the relay exports (relay/metrics.rs), and `up` from Prometheus itself.
KNOWN_METRICS="
outbox_delivered_total
outbox_replays_total
outbox_duplicate_enqueues_total
outbox_attempts_total
outbox_fencing_rejections_total
outbox_leases_expired_total
outbox_reconcile_total
outbox_deferrals_total
outbox_invariant_violations_total
outbox_intents
outbox_oldest_due_seconds
outbox_attempt_duration_seconds_bucket
outbox_attempt_duration_seconds_sum
outbox_attempt_duration_seconds_count
outbox_delivery_latency_seconds_bucket
outbox_delivery_latency_seconds_sum
outbox_delivery_latency_seconds_count
up
"

say() { printf 'check.sh: %s\n' "$*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }

failed=0
fail() {
	say "FAIL: $*"
	failed=1
}

# apt-get install prometheus (it ships /usr/bin/promtool). Waits for the dpkg
# lock if another apt-get is running; runs apt-get update only when the
# plain install fails.
install_promtool() {
	[ "$(id -u)" -eq 0 ] && have apt-get || return 1
	local apt=(apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 prometheus)
	say "promtool is missing; running: ${apt[*]}"
	if DEBIAN_FRONTEND=noninteractive "${apt[@]}" >&2; then
		return 0
	fi
	say "install failed; running: apt-get update, then the install again"
	DEBIAN_FRONTEND=noninteractive apt-get update -q -o DPkg::Lock::Timeout=600 >&2 || return 1
	DEBIAN_FRONTEND=noninteractive "${apt[@]}" >&2
}

# 1. promtool
if ! have promtool; then
	install_promtool || true
fi
if have promtool; then
	say "promtool check rules $RULES"
	promtool check rules "$RULES" || fail "promtool check rules $RULES"
	say "promtool test rules $RULES_TEST"
	promtool test rules "$RULES_TEST" || fail "promtool test rules $RULES_TEST"
else
	echo "check.sh: skipped: promtool not available (promtool check rules, promtool test rules)"
fi

# 2. The dashboard is valid JSON.
say "JSON: $DASHBOARD"
if have python3; then
	python3 -m json.tool "$DASHBOARD" >/dev/null || fail "$DASHBOARD is not valid JSON"
elif have jq; then
	jq empty "$DASHBOARD" || fail "$DASHBOARD is not valid JSON"
else
	fail "neither python3 nor jq is available to parse $DASHBOARD"
fi

# 3. Metric names. A name is every outbox_* word, and every word directly
# followed by a selector `{` or a range `[` (so a misspelt `up` or a
# name without the prefix is caught too).
metric_names() {
	{
		grep -oE '\boutbox_[A-Za-z0-9_:]*' "$1" || true
		grep -oE '\b[A-Za-z_:][A-Za-z0-9_:]*[{[]' "$1" | sed 's/.$//' || true
	} | sort -u
}
for f in "$RULES" "$DASHBOARD"; do
	names=$(metric_names "$f")
	if [ -z "$names" ]; then
		fail "$f: no metric names found"
		continue
	fi
	unknown=0
	while read -r name; do
		if ! grep -qxF "$name" <<<"$KNOWN_METRICS"; then
			fail "$f: unknown metric name: $name"
			unknown=1
		fi
	done <<<"$names"
	if [ "$unknown" -eq 0 ]; then
		say "metric names in $f, all known: $(tr '\n' ' ' <<<"$names")"
	fi
done

# 4. The systemd unit: every directive is checked by systemd itself; the
#    binary path is swapped for one that exists on a build machine.
UNIT=deploy/systemd/outbox-relay.service
if command -v systemd-analyze >/dev/null 2>&1; then
	unit_dir=$(mktemp -d)
	sed 's|/usr/local/bin/outbox-relay|/bin/true|g' "$UNIT" >"$unit_dir/outbox-relay.service"
	if out=$(systemd-analyze verify "$unit_dir/outbox-relay.service" 2>&1) && [ -z "$out" ]; then
		say "systemd-analyze verify $UNIT: ok"
	else
		fail "systemd-analyze verify $UNIT: $out"
	fi
	rm -rf "$unit_dir"
else
	say "skipped: systemd-analyze not available for $UNIT"
fi

if [ "$failed" -ne 0 ]; then
	say "FAILED"
	exit 1
fi
say "OK"
