# shellcheck shell=bash
# deploy/lib/scratch-rabbit.sh: make a RabbitMQ broker available for the
# amqp kind's tests. Sourced after scratch-pg.sh (say, have, can_apt,
# apt_install, tcp_open).
#
#   scratch_rabbit_setup   sets OUTBOX_TEST_AMQP_URL / OUTBOX_TEST_AMQP_PASSWORD
#   scratch_rabbit_stop    stops the private node, if one was started
#
# In order: $OUTBOX_TEST_AMQP_URL when it answers; else a private node (its
# own loopback port, distribution port and data directory, removed on stop),
# installing Debian's rabbitmq-server as root when it is missing; else the
# machine's broker on 127.0.0.1:5672, started when it is installed but
# stopped. Says what is missing when none of that works.

SCRATCH_RABBIT_DIR=""
SCRATCH_RABBIT_STARTED=0
SCRATCH_RABBIT_NODE=""

rabbit_server_bin() {
	local b
	for b in /usr/lib/rabbitmq/bin/rabbitmq-server /usr/sbin/rabbitmq-server; do
		[ -x "$b" ] && {
			echo "$b"
			return 0
		}
	done
	return 1
}

# A loopback port nothing listens on (best effort).
rabbit_free_port() {
	local p _
	for _ in $(seq 1 50); do
		p=$((20000 + RANDOM % 20000))
		tcp_open 127.0.0.1 "$p" || {
			echo "$p"
			return 0
		}
	done
	return 1
}

# Wait until HOST:PORT takes TCP connections (at most $3 seconds).
rabbit_wait() {
	local _
	for _ in $(seq 1 $(($3 * 4))); do
		tcp_open "$1" "$2" && return 0
		sleep 0.25
	done
	return 1
}

scratch_rabbit_private() {
	local bin port dist
	bin=$(rabbit_server_bin) || return 1
	port=$(rabbit_free_port) || return 1
	dist=$(rabbit_free_port) || return 1
	while [ "$dist" = "$port" ]; do dist=$(rabbit_free_port) || return 1; done
	SCRATCH_RABBIT_NODE="outboxtest$$@localhost"
	SCRATCH_RABBIT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/outbox-test-rabbit.XXXXXX")
	say "starting a private RabbitMQ node on 127.0.0.1:$port (data in $SCRATCH_RABBIT_DIR)"
	if ! env HOME="$SCRATCH_RABBIT_DIR" \
		RABBITMQ_NODENAME="$SCRATCH_RABBIT_NODE" \
		RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
		RABBITMQ_NODE_PORT="$port" \
		RABBITMQ_DIST_PORT="$dist" \
		RABBITMQ_MNESIA_BASE="$SCRATCH_RABBIT_DIR/mnesia" \
		RABBITMQ_LOG_BASE="$SCRATCH_RABBIT_DIR/log" \
		RABBITMQ_ENABLED_PLUGINS_FILE="$SCRATCH_RABBIT_DIR/plugins" \
		RABBITMQ_CONFIG_FILE="$SCRATCH_RABBIT_DIR/rabbitmq" \
		RABBITMQ_PID_FILE="$SCRATCH_RABBIT_DIR/pid" \
		"$bin" -detached >"$SCRATCH_RABBIT_DIR/start.log" 2>&1; then
		say "the private RabbitMQ node did not start: $(tail -n 3 "$SCRATCH_RABBIT_DIR/start.log")"
		return 1
	fi
	SCRATCH_RABBIT_STARTED=1
	if ! rabbit_wait 127.0.0.1 "$port" 90; then
		say "the private RabbitMQ node did not listen within 90s; its log: $SCRATCH_RABBIT_DIR/log"
		return 1
	fi
	export OUTBOX_TEST_AMQP_URL="amqp://guest@127.0.0.1:$port/%2f"
	export OUTBOX_TEST_AMQP_PASSWORD=guest
}

scratch_rabbit_setup() {
	if [ -n "${OUTBOX_TEST_AMQP_URL:-}" ]; then
		local hp=${OUTBOX_TEST_AMQP_URL#*://} host port
		hp=${hp#*@}
		hp=${hp%%/*}
		host=${hp%%:*}
		port=5672
		[ "$hp" = "$host" ] || port=${hp##*:}
		if tcp_open "$host" "$port"; then
			say "RabbitMQ test peer: $OUTBOX_TEST_AMQP_URL (given)"
			return 0
		fi
		say "OUTBOX_TEST_AMQP_URL=$OUTBOX_TEST_AMQP_URL does not answer; looking for another broker"
	fi
	if ! rabbit_server_bin >/dev/null && can_apt; then
		say "rabbitmq-server is missing; installing Debian's rabbitmq-server"
		apt_install rabbitmq-server || true
	fi
	if rabbit_server_bin >/dev/null; then
		if scratch_rabbit_private; then
			say "RabbitMQ test peer: private node at $OUTBOX_TEST_AMQP_URL"
			return 0
		fi
		scratch_rabbit_stop
	fi
	if ! tcp_open 127.0.0.1 5672 && rabbit_server_bin >/dev/null; then
		say "starting the machine's rabbitmq-server service"
		if have service; then service rabbitmq-server start >&2 || true; fi
		rabbit_wait 127.0.0.1 5672 60 || true
	fi
	if tcp_open 127.0.0.1 5672; then
		export OUTBOX_TEST_AMQP_URL="amqp://guest@127.0.0.1:5672/%2f"
		export OUTBOX_TEST_AMQP_PASSWORD=${OUTBOX_TEST_AMQP_PASSWORD:-guest}
		say "RabbitMQ test peer: the machine's broker on 127.0.0.1:5672 (each test declares its own exchange and queue)"
		return 0
	fi
	say "warning: no RabbitMQ broker is available; the amqp tests will say so"
	say "warning: install it (apt-get install rabbitmq-server, as root) or set OUTBOX_TEST_AMQP_URL and OUTBOX_TEST_AMQP_PASSWORD"
}

scratch_rabbit_stop() {
	[ -n "$SCRATCH_RABBIT_DIR" ] || return 0
	local pid _
	if [ "$SCRATCH_RABBIT_STARTED" = 1 ] && pid=$(cat "$SCRATCH_RABBIT_DIR/pid" 2>/dev/null); then
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 1 40); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.25
		done
		kill -9 "$pid" 2>/dev/null || true
	elif [ "$SCRATCH_RABBIT_STARTED" = 1 ] && [ -n "$SCRATCH_RABBIT_NODE" ] && have pkill; then
		# no pid file: find the node by its name
		pkill -KILL -f -- "$SCRATCH_RABBIT_NODE" 2>/dev/null || true
	fi
	rm -rf "$SCRATCH_RABBIT_DIR"
	SCRATCH_RABBIT_DIR=""
	SCRATCH_RABBIT_STARTED=0
}
