#!/usr/bin/env bash
# tests/peers/pg-cluster.sh: a private PostgreSQL cluster that a test may
# restart (the chaos drill restarts its database mid-run; the shared test
# server must not be touched).
#
#   pg-cluster.sh start NAME    start a cluster; print its URL, then its data dir
#   pg-cluster.sh restart DIR   pg_ctl restart -m fast (every connection is cut)
#   pg-cluster.sh stop DIR      stop it and remove its files
#
# Uses deploy/lib/scratch-pg.sh: the local server binaries, installed with
# apt-get when missing and run as root; as root the cluster runs as the
# postgres (or outbox-pg) user.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LOG_PREFIX=pg-cluster
# shellcheck source=deploy/lib/scratch-pg.sh
. "$REPO_ROOT/deploy/lib/scratch-pg.sh"

usage() {
	echo "usage: $0 start NAME | restart DIR | stop DIR" >&2
	exit 2
}

# The binaries and the user that own an existing cluster directory.
attach() {
	local dir=$1
	[ -f "$dir/PG_VERSION" ] || die "$dir is not a PostgreSQL data directory"
	find_pg_server || die "no PostgreSQL server binaries (initdb, pg_ctl) found"
	if is_root; then
		SCRATCH_PG_USER=$(stat -c %U "$dir")
	fi
}

[ $# -eq 2 ] || usage
case $1 in
start)
	# a start that fails half way leaves nothing running
	trap scratch_pg_stop EXIT
	scratch_pg_start "$2"
	trap - EXIT
	# the cluster outlives this script: no lock to keep
	rm -f "$SCRATCH_PG_LOCK"
	printf '%s\n%s\n' "$DATABASE_URL" "$SCRATCH_PG_DIR"
	;;
restart)
	attach "$2"
	as_pg_user "$PG_CTL" -D "$2" -l "$2/server.log" -m fast -w -t 60 restart >/dev/null
	;;
stop)
	attach "$2"
	as_pg_user "$PG_CTL" -D "$2" -m fast -w stop >/dev/null 2>&1 || true
	rm -rf "$2"
	;;
*) usage ;;
esac
