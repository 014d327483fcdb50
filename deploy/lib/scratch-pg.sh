# shellcheck shell=bash
# deploy/lib/scratch-pg.sh: the Postgres logic shared by tests/run.sh and
# deploy/demo.sh. Source it; do not run it.
#
# The caller sets REPO_ROOT (the repository root) and LOG_PREFIX (e.g. run.sh),
# then calls `scratch_pg_setup NAME` and, from its EXIT trap, `scratch_pg_stop`.
#
# scratch_pg_setup uses $DATABASE_URL when it is set and the server answers.
# Otherwise it starts a throwaway cluster from local PostgreSQL server binaries
# (installing them with apt-get when root), in $REPO_ROOT/.scratch/NAME,
# listening on 127.0.0.1 only, on a free port from 55432 up, and exports
# DATABASE_URL=postgres://postgres@127.0.0.1:PORT/postgres.
# SCRATCH_PG_EXTERNAL is 1 when the caller's DATABASE_URL is used, 0 otherwise.

SCRATCH_PG_DIR=""
SCRATCH_PG_LOCK=""
SCRATCH_PG_USER=""
SCRATCH_PG_EXTERNAL=0
PG_INITDB=""
PG_CTL=""
APT_UPDATED=${APT_UPDATED:-0}

say() { printf '%s: %s\n' "${LOG_PREFIX:-scratch-pg}" "$*" >&2; }
die() {
	say "error: $*"
	exit 1
}

is_root() { [ "$(id -u)" -eq 0 ]; }
have() { command -v "$1" >/dev/null 2>&1; }
can_apt() { is_root && have apt-get; }

# apt-get install PACKAGES..., running `apt-get update` once per script run.
apt_install() {
	can_apt || return 1
	if [ "$APT_UPDATED" != 1 ]; then
		say "running: apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -q -o DPkg::Lock::Timeout=600 >&2 || return 1
		APT_UPDATED=1
	fi
	say "running: apt-get install -y --no-install-recommends $*"
	# waits for the dpkg lock: parallel tests may install at the same moment
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		-o DPkg::Lock::Timeout=600 "$@" >&2
}

# Does something accept TCP connections on HOST PORT?
tcp_open() {
	if have timeout; then
		# shellcheck disable=SC2016 # expanded by the inner bash
		timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
	else
		(exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
	fi
}

# Set PG_URL_HOST and PG_URL_PORT from a postgres:// URL or a key=value
# connection string (best effort; defaults localhost and 5432).
pg_url_host_port() {
	local url=$1 rest host="" port=""
	if [[ $url == *://* ]]; then
		rest=${url#*://}
		rest=${rest%%[/?]*}
		rest=${rest##*@}
		if [[ $rest == \[* ]]; then
			host=${rest%%]*}
			host=${host#[}
			[[ $rest == *]:* ]] && port=${rest##*]:}
		elif [[ $rest == *:* ]]; then
			host=${rest%%:*}
			port=${rest##*:}
		else
			host=$rest
		fi
		[[ $url =~ [?\&]host=([^\&]+) ]] && host=${BASH_REMATCH[1]}
		[[ $url =~ [?\&]port=([0-9]+) ]] && port=${BASH_REMATCH[1]}
	else
		[[ $url =~ (^|[[:space:]])host=([^[:space:]]+) ]] && host=${BASH_REMATCH[2]}
		[[ $url =~ (^|[[:space:]])port=([0-9]+) ]] && port=${BASH_REMATCH[2]}
	fi
	# A socket directory cannot be probed over TCP: fall back to localhost.
	[[ -z $host || $host == /* || $host == %2[Ff]* ]] && host=localhost
	PG_URL_HOST=$host
	PG_URL_PORT=${port:-5432}
}

# PostgreSQL bin directories under /usr/lib/postgresql, newest version first.
pg_bindirs() {
	local d
	for d in /usr/lib/postgresql/*/bin; do
		[ -d "$d" ] && printf '%s\n' "$d"
	done | sort -rV
}

# Print the path of a PostgreSQL tool: from PATH, else the newest bin dir.
find_pg_tool() {
	local d
	if have "$1"; then
		command -v "$1"
		return 0
	fi
	while read -r d; do
		if [ -x "$d/$1" ]; then
			printf '%s\n' "$d/$1"
			return 0
		fi
	done < <(pg_bindirs)
	return 1
}

# Set PG_INITDB and PG_CTL (both from PATH, or both from one bin dir).
find_pg_server() {
	local d
	if have initdb && have pg_ctl; then
		PG_INITDB=$(command -v initdb)
		PG_CTL=$(command -v pg_ctl)
		return 0
	fi
	while read -r d; do
		if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
			PG_INITDB=$d/initdb
			PG_CTL=$d/pg_ctl
			return 0
		fi
	done < <(pg_bindirs)
	return 1
}

# Does the server behind a connection URL answer?
pg_answers() {
	local isready
	if isready=$(find_pg_tool pg_isready); then
		"$isready" -q -t 5 -d "$1" >/dev/null 2>&1
	else
		pg_url_host_port "$1"
		tcp_open "$PG_URL_HOST" "$PG_URL_PORT"
	fi
}

# Run a command as the cluster's owner (initdb and postgres refuse root).
as_pg_user() {
	if [ -n "$SCRATCH_PG_USER" ]; then
		(cd / && runuser -u "$SCRATCH_PG_USER" -- "$@")
	else
		"$@"
	fi
}

pick_pg_user() {
	SCRATCH_PG_USER=""
	is_root || return 0
	if id -u postgres >/dev/null 2>&1; then
		SCRATCH_PG_USER=postgres
		return 0
	fi
	if ! id -u outbox-pg >/dev/null 2>&1; then
		have useradd || die "running as root, and useradd is missing: cannot create a user for the scratch cluster"
		say "creating system user outbox-pg (initdb refuses to run as root)"
		useradd --system --no-create-home --home-dir /nonexistent \
			--shell /usr/sbin/nologin outbox-pg
	fi
	SCRATCH_PG_USER=outbox-pg
}

install_pg_server() {
	find_pg_server && return 0
	if can_apt; then
		say "PostgreSQL server binaries (initdb, pg_ctl) not found; installing them"
		apt_install postgresql || say "warning: apt-get install postgresql failed"
		find_pg_server && return 0
	fi
	say "error: no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under /usr/lib/postgresql/*/bin."
	say "Install them (Debian/Ubuntu: apt-get install postgresql), or set DATABASE_URL to a server"
	say "where this user may create databases, e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres"
	exit 1
}

# Stop a cluster left by an earlier run that was killed, and remove its files.
remove_stale_cluster() {
	local dir=$1
	[ -e "$dir" ] || return 0
	if [ -f "$dir/postmaster.pid" ]; then
		say "stopping a cluster left over in $dir"
		as_pg_user "$PG_CTL" -D "$dir" -m immediate -w stop >/dev/null 2>&1 || true
	fi
	rm -rf "$dir"
}

# TLS for the scratch cluster, as production servers have it: a throwaway CA
# (ca.crt, for sslmode=verify-full) and a server certificate it signed for
# localhost and 127.0.0.1. Needs openssl (installed when missing and root).
scratch_pg_tls() {
	local dir=$1 f
	if ! have openssl && can_apt; then
		apt_install openssl || true
	fi
	if ! have openssl; then
		say "warning: openssl is missing: the scratch cluster runs without TLS (apt-get install openssl)"
		return 0
	fi
	printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "basicConstraints=CA:FALSE" \
		"keyUsage=digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" >"$dir/server.ext"
	if ! {
		openssl req -new -x509 -days 30 -nodes -subj "/CN=outbox-relay scratch CA" \
			-keyout "$dir/ca.key" -out "$dir/ca.crt" &&
			openssl req -new -nodes -subj "/CN=localhost" \
				-keyout "$dir/server.key" -out "$dir/server.csr" &&
			openssl x509 -req -days 30 -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
				-CAcreateserial -extfile "$dir/server.ext" -out "$dir/server.crt"
	} >/dev/null 2>&1; then
		say "warning: openssl could not make certificates: the scratch cluster runs without TLS"
		rm -f "$dir"/ca.* "$dir"/server.*
		return 0
	fi
	rm -f "$dir/ca.key" "$dir/ca.srl" "$dir/server.csr" "$dir/server.ext"
	chmod 600 "$dir/server.key"
	for f in ca.crt server.crt server.key; do
		[ -n "$SCRATCH_PG_USER" ] && chown "$SCRATCH_PG_USER:" "$dir/$f"
	done
	echo "ssl = on" >>"$dir/postgresql.conf"
}

scratch_pg_start() {
	local dir out
	install_pg_server
	pick_pg_user
	scratch_pg_dir "$1"
	dir=$SCRATCH_PG_DIR

	say "starting a scratch PostgreSQL cluster in $dir ($("$PG_CTL" --version 2>/dev/null || echo pg_ctl)${SCRATCH_PG_USER:+, as user $SCRATCH_PG_USER})"
	if ! out=$(as_pg_user "$PG_INITDB" -D "$dir" -A trust -U postgres -E UTF8 --no-locale 2>&1); then
		printf '%s\n' "$out" >&2
		die "initdb failed"
	fi
	{
		echo
		echo "# added by deploy/lib/scratch-pg.sh"
		echo "listen_addresses = '127.0.0.1'"
		echo "max_connections = 200"
	} >>"$dir/postgresql.conf"
	scratch_pg_socket_dir "$dir"
	scratch_pg_tls "$dir"
	scratch_pg_serve "$dir"
}

# Its own Unix socket directory for the cluster in DIR (a copy made by
# pg_basebackup would otherwise share its primary's). Sockets have a path
# limit of about 107 bytes: without room, TCP only.
scratch_pg_socket_dir() {
	local dir=$1 sockdir=$1
	[ "${#dir}" -gt 90 ] && sockdir=""
	echo "unix_socket_directories = '${sockdir//\'/\'\'}'" >>"$dir/postgresql.conf"
}

# An empty data directory .scratch/NAME (or a fresh one under $TMPDIR when
# the cluster's user cannot reach the repository), owned by that user and
# locked by this process: sets SCRATCH_PG_DIR and SCRATCH_PG_LOCK.
scratch_pg_dir() {
	local name=$1 scratch="$REPO_ROOT/.scratch" dir lock other
	mkdir -p "$scratch"
	lock="$scratch/$name.pid"
	if [ -f "$lock" ] && other=$(cat "$lock" 2>/dev/null) && [ -n "$other" ] &&
		[ "$other" != "$$" ] && kill -0 "$other" 2>/dev/null; then
		say "another run (pid $other) is using .scratch/$name; using .scratch/$name.$$"
		name="$name.$$"
		lock="$scratch/$name.pid"
	fi
	echo "$$" >"$lock"
	SCRATCH_PG_LOCK=$lock
	dir="$scratch/$name"
	remove_stale_cluster "$dir"
	mkdir -m 700 "$dir"
	SCRATCH_PG_DIR=$dir
	if [ -n "$SCRATCH_PG_USER" ]; then
		chown "$SCRATCH_PG_USER:" "$dir"
		if ! as_pg_user test -w "$dir"; then
			# The repository is not reachable by that user (e.g. under /root).
			rmdir "$dir"
			dir=$(mktemp -d "${TMPDIR:-/tmp}/outbox-$name.XXXXXX")
			SCRATCH_PG_DIR=$dir
			chown "$SCRATCH_PG_USER:" "$dir"
			say "user $SCRATCH_PG_USER cannot reach $scratch; using $dir instead"
		fi
	fi
}

# Start the cluster in DIR on a free port from 55432 up, wait until it
# answers, and export DATABASE_URL for it.
scratch_pg_serve() {
	local dir=$1 port tries=0 i isready
	port=55432
	while :; do
		while tcp_open 127.0.0.1 "$port"; do
			port=$((port + 1))
			[ "$port" -lt 55632 ] || die "no free port between 55432 and 55631 on 127.0.0.1"
		done
		if as_pg_user "$PG_CTL" -D "$dir" -l "$dir/server.log" -o "-p $port" -w -t 30 start >/dev/null 2>&1; then
			break
		fi
		tries=$((tries + 1))
		if [ "$tries" -ge 3 ]; then
			tail -n 20 "$dir/server.log" >&2 2>/dev/null || true
			die "the scratch PostgreSQL cluster did not start (server log above)"
		fi
		say "start on port $port failed; trying another port"
		as_pg_user "$PG_CTL" -D "$dir" -m immediate stop >/dev/null 2>&1 || true
		port=$((port + 1))
	done

	isready=$(find_pg_tool pg_isready || true)
	for ((i = 0; i < 60; i++)); do
		if [ -n "$isready" ]; then
			"$isready" -q -h 127.0.0.1 -p "$port" -U postgres -t 1 >/dev/null 2>&1 && break
		else
			tcp_open 127.0.0.1 "$port" && break
		fi
		sleep 0.5
	done
	[ "$i" -lt 60 ] || die "the scratch PostgreSQL cluster is not ready after 30s (log: $dir/server.log)"
	export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
	say "scratch PostgreSQL is up: DATABASE_URL=$DATABASE_URL"
}

scratch_pg_setup() {
	if [ -n "${DATABASE_URL:-}" ]; then
		pg_url_host_port "$DATABASE_URL"
		if pg_answers "$DATABASE_URL"; then
			# shellcheck disable=SC2034 # read by the scripts that source this file
			SCRATCH_PG_EXTERNAL=1
			say "using DATABASE_URL (server at $PG_URL_HOST:$PG_URL_PORT answers)"
			return 0
		fi
		say "warning: DATABASE_URL is set but its server ($PG_URL_HOST:$PG_URL_PORT) does not answer; starting a scratch cluster instead"
	fi
	unset DATABASE_URL
	scratch_pg_start "$1"
}

# Stop the scratch cluster (if this run started one) and remove its files.
scratch_pg_stop() {
	local dir=$SCRATCH_PG_DIR
	SCRATCH_PG_DIR=""
	if [ -n "$dir" ]; then
		if [ -f "$dir/postmaster.pid" ]; then
			say "stopping the scratch PostgreSQL cluster"
			as_pg_user "$PG_CTL" -D "$dir" -m fast -w stop >/dev/null 2>&1 ||
				say "warning: pg_ctl stop failed (data dir $dir)"
		fi
		rm -rf "$dir"
	fi
	if [ -n "$SCRATCH_PG_LOCK" ]; then
		rm -f "$SCRATCH_PG_LOCK"
		SCRATCH_PG_LOCK=""
	fi
}
