#!/usr/bin/env bash
# tests/peers/pg-cluster.sh: a private PostgreSQL cluster that a test may
# restart (the chaos drill restarts its database mid-run; the shared test
# server must not be touched).
#
#   pg-cluster.sh start NAME    start a cluster; print its URL, then its data dir
#   pg-cluster.sh replica DIR NAME
#                               start an asynchronous streaming standby of the
#                               cluster in DIR (pg_basebackup -R); print as start
#   pg-cluster.sh restart DIR   pg_ctl restart -m fast (every connection is cut)
#   pg-cluster.sh kill DIR      SIGKILL the server and all its processes at once,
#                               as when its machine dies
#   pg-cluster.sh promote DIR   pg_ctl promote: the standby becomes a primary
#   pg-cluster.sh stop DIR      stop it and remove its files
#   pg-cluster.sh tool NAME     print the path of a PostgreSQL client program
#                               (pg_receivewal, for one) beside the server's
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
	echo "usage: $0 start NAME | replica DIR NAME | restart DIR | kill DIR | promote DIR | stop DIR | tool NAME" >&2
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

# The port the cluster in DIR listens on (from its postmaster.pid).
port_of() {
	sed -n 4p "$1/postmaster.pid"
}

if [ "${1:-}" = replica ]; then
	[ $# -eq 3 ] || usage
	attach "$2"
	primary_port=$(port_of "$2")
	basebackup=$(find_pg_tool pg_basebackup) || die "pg_basebackup not found"
	trap scratch_pg_stop EXIT
	scratch_pg_dir "$3"
	say "taking a base backup of the cluster on port $primary_port into $SCRATCH_PG_DIR"
	as_pg_user "$basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres -D "$SCRATCH_PG_DIR" \
		-R -X stream -c fast >&2 || die "pg_basebackup failed"
	rm -f "$SCRATCH_PG_DIR/server.log"
	scratch_pg_socket_dir "$SCRATCH_PG_DIR"
	scratch_pg_serve "$SCRATCH_PG_DIR"
	trap - EXIT
	rm -f "$SCRATCH_PG_LOCK"
	printf '%s\n%s\n' "$DATABASE_URL" "$SCRATCH_PG_DIR"
	exit 0
fi

[ $# -eq 2 ] || usage
case $1 in
tool)
	find_pg_tool "$2" || die "$2 not found"
	;;
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
kill)
	attach "$2"
	pid=$(head -n 1 "$2/postmaster.pid")
	children=()
	for proc in /proc/[0-9]*; do
		[ "$(awk '/^PPid:/ { print $2 }' "$proc/status" 2>/dev/null)" = "$pid" ] &&
			children+=("${proc#/proc/}")
	done
	# the postmaster and its children in one signal: none outlives the rest
	kill -KILL "$pid" "${children[@]}" 2>/dev/null || true
	;;
promote)
	attach "$2"
	as_pg_user "$PG_CTL" -D "$2" -w -t 60 promote >/dev/null
	;;
stop)
	attach "$2"
	as_pg_user "$PG_CTL" -D "$2" -m fast -w stop >/dev/null 2>&1 || true
	rm -rf "$2"
	;;
*) usage ;;
esac
