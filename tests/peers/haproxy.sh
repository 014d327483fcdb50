#!/usr/bin/env bash
# tests/peers/haproxy.sh: print the path of HAProxy, installing Debian's
# package (apt-get install haproxy) when it is missing and this runs as
# root. The failover drill puts it in front of a primary and its standby,
# as Patroni-style deployments do.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LOG_PREFIX=haproxy
# shellcheck source=deploy/lib/scratch-pg.sh
. "$REPO_ROOT/deploy/lib/scratch-pg.sh"

if ! have haproxy; then
	say "HAProxy is not installed; installing Debian's package"
	apt_install haproxy || die "could not install HAProxy (apt-get install haproxy)"
fi
command -v haproxy
