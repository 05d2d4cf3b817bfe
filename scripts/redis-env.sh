#!/usr/bin/env bash
# redis-env.sh starts throwaway Redis servers on loopback, runs a command with
# their addresses in the environment, and tears everything down afterwards.
#
# Usage: scripts/redis-env.sh COMMAND [ARGS...]
#
# It needs redis-server and redis-cli of Redis 7.0 or later, and installs
# them with apt-get when they are missing and it runs as root.
#
# Started servers (all bound to 127.0.0.1, no persistence):
#   - a standalone primary without replicas      CONTSTORE_REDIS_ADDR
#   - a standalone primary with one replica      CONTSTORE_REDIS_REPLICATED_ADDR
#   - a 3-master cluster (no replicas)           CONTSTORE_CLUSTER_ADDRS (comma separated)
# Also exported:
#   CONTSTORE_REDIS_SERVER  path of the redis-server binary
#   CONTSTORE_REDIS_TMP     scratch directory, removed on exit
#
# The exit status is the command's. Every server started here is stopped and
# the scratch directory removed on exit, including on failure, SIGINT and
# SIGTERM. Set REDIS_ENV_VERBOSE=1 for progress messages.
set -euo pipefail

readonly PROG=${0##*/}
readonly START_TIMEOUT=${REDIS_ENV_START_TIMEOUT:-30} # seconds
readonly STOP_TIMEOUT=${REDIS_ENV_STOP_TIMEOUT:-10}   # seconds

TMP=""
SERVER_PIDS=()
CMD_PID=""
CMD_PGID=""
HELPER_PID=""
CLEANED=0
USED_PORTS=" "

log() {
	if [[ ${REDIS_ENV_VERBOSE:-0} != 0 ]]; then
		# "|| true": a closed stderr must not stop the script before cleanup.
		printf '%s: %s\n' "$PROG" "$*" >&2 || true
	fi
}

die() {
	printf '%s: %s\n' "$PROG" "$*" >&2
	exit 1
}

dump_logs() {
	[[ -n $TMP && -d $TMP ]] || return 0
	local f
	for f in "$TMP"/*/redis.log; do
		[[ -f $f ]] || continue
		printf '%s: ---- %s ----\n' "$PROG" "${f#"$TMP"/}" >&2
		tail -n 40 "$f" >&2 || true
	done
}

fail() {
	printf '%s: %s\n' "$PROG" "$*" >&2
	dump_logs
	exit 1
}

alive() {
	kill -0 -- "$1" 2>/dev/null
}

# stop_pids SIGNAL PID... sends SIGNAL, waits up to STOP_TIMEOUT seconds and
# then sends SIGKILL to whatever is left. A negative PID names a process group.
stop_pids() {
	local sig=$1 p waited=0 left
	shift
	[[ $# -gt 0 ]] || return 0
	for p in "$@"; do
		kill "-$sig" -- "$p" 2>/dev/null || true
	done
	while :; do
		left=()
		for p in "$@"; do
			if alive "$p"; then
				left+=("$p")
			fi
		done
		[[ ${#left[@]} -gt 0 ]] || break
		if ((waited >= STOP_TIMEOUT * 10)); then
			for p in "${left[@]}"; do
				if [[ $p == -* ]]; then
					printf '%s: process group %s did not stop, killing it\n' "$PROG" "${p#-}" >&2
				else
					printf '%s: process %s did not stop, killing it\n' "$PROG" "$p" >&2
				fi
				kill -KILL -- "$p" 2>/dev/null || true
			done
			break
		fi
		sleep 0.1
		waited=$((waited + 1))
	done
}

cleanup() {
	((CLEANED)) && return 0
	CLEANED=1
	trap '' INT TERM HUP PIPE
	if [[ -n $HELPER_PID ]]; then
		stop_pids TERM "$HELPER_PID"
		wait "$HELPER_PID" 2>/dev/null || true
	fi
	if [[ -n $CMD_PGID ]] && alive "-$CMD_PGID"; then
		# The command runs in its own process group: stop whatever is left of
		# it, so that e.g. test binaries started by "go test" do not outlive it.
		stop_pids TERM "-$CMD_PGID"
		wait "$CMD_PGID" 2>/dev/null || true
	fi
	if [[ ${#SERVER_PIDS[@]} -gt 0 ]]; then
		log "stopping servers: ${SERVER_PIDS[*]}"
		stop_pids TERM "${SERVER_PIDS[@]}"
		local p
		for p in "${SERVER_PIDS[@]}"; do
			wait "$p" 2>/dev/null || true
		done
	fi
	if [[ -n $TMP && -d $TMP ]]; then
		rm -rf -- "$TMP"
	fi
}

on_signal() {
	local sig=$1 code=$2
	# Ignore further signals first: logging to a closed stderr raises
	# SIGPIPE again, which would otherwise recurse until bash crashes and
	# leaves the servers running.
	trap '' INT TERM HUP PIPE
	log "received SIG$sig"
	if [[ -n $CMD_PGID ]] && alive "-$CMD_PGID"; then
		# Pass the signal on (SIGTERM for SIGPIPE) and give the command a
		# chance to shut down by itself before it is killed.
		[[ $sig == PIPE ]] && sig=TERM
		stop_pids "$sig" "-$CMD_PGID"
	fi
	exit "$code"
}

trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP
trap 'on_signal PIPE 141' PIPE

ensure_redis() {
	if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
		return 0
	fi
	if [[ $(id -u) -ne 0 ]]; then
		die "redis-server and redis-cli are required; install them, e.g. 'sudo apt-get install -y redis-server redis-tools' (Debian/Ubuntu) or 'brew install redis' (macOS)"
	fi
	command -v apt-get >/dev/null 2>&1 ||
		die "redis-server and redis-cli are required and apt-get is not available; install Redis (7.0 or later) manually"
	printf '%s: installing redis-server and redis-tools with apt-get\n' "$PROG" >&2
	local apt_opts=(-q -o DPkg::Lock::Timeout=600)
	DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update >/dev/null ||
		die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends \
		redis-server redis-tools >/dev/null ||
		die "apt-get install redis-server redis-tools failed"
	command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 ||
		die "redis-server/redis-cli still not found after installation"
}

# check_redis_version fails unless redis-server is Redis 7.0 or later, the
# oldest release the README supports (older servers would also refuse
# --shutdown-timeout, below, with a less helpful message).
readonly MIN_REDIS_MAJOR=7 MIN_REDIS_MINOR=0
check_redis_version() {
	local bin out major minor
	bin=$(command -v redis-server)
	out=$(timeout 10 redis-server --version 2>&1 </dev/null) ||
		die "'$bin --version' failed: $out"
	if [[ ! $out =~ v=([0-9]+)\.([0-9]+) ]]; then
		die "cannot tell the version of $bin from '$out'; Redis $MIN_REDIS_MAJOR.$MIN_REDIS_MINOR or later is required"
	fi
	major=$((10#${BASH_REMATCH[1]}))
	minor=$((10#${BASH_REMATCH[2]}))
	if ((major < MIN_REDIS_MAJOR || (major == MIN_REDIS_MAJOR && minor < MIN_REDIS_MINOR))); then
		die "$bin is Redis $major.$minor ('$out'); Redis $MIN_REDIS_MAJOR.$MIN_REDIS_MINOR or later is required: install a newer one (e.g. from https://packages.redis.io, or 'brew install redis') and put it first on PATH"
	fi
	log "$bin is Redis $major.$minor"
}

# port_in_use PORT succeeds when something listens on 127.0.0.1:PORT (or on
# any address with that port).
port_in_use() {
	local p=$1
	if command -v ss >/dev/null 2>&1; then
		[[ -n $(ss -Htln "sport = :$p" 2>/dev/null) ]] && return 0
	fi
	(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null
}

# pick_port [BUS] prints a free port not handed out before; with BUS set,
# PORT+10000 (the cluster bus port) must be free too.
pick_port() {
	local bus=${1:-} p tries
	for ((tries = 0; tries < 200; tries++)); do
		# 10000-21999 keeps PORT and PORT+10000 below the usual ephemeral range.
		p=$((10000 + (RANDOM * 32768 + RANDOM) % 12000))
		[[ $USED_PORTS == *" $p "* ]] && continue
		port_in_use "$p" && continue
		if [[ -n $bus ]]; then
			[[ $USED_PORTS == *" $((p + 10000)) "* ]] && continue
			port_in_use "$((p + 10000))" && continue
		fi
		printf '%s\n' "$p"
		return 0
	done
	fail "could not find a free loopback port"
}

rcli() {
	local port=$1
	shift
	redis-cli -h 127.0.0.1 -p "$port" "$@"
}

# start_server NAME [BUS] -- EXTRA_ARGS... starts a server in $TMP/NAME on a
# free port, waits until it answers PING and sets STARTED_PORT. A start that
# loses a race for its port is retried on another one.
STARTED_PORT=""
start_server() {
	local name=$1 bus=$2
	shift 3
	local dir="$TMP/$name" attempt port pid i
	mkdir -p "$dir"
	for attempt in 1 2 3 4 5; do
		port=$(pick_port "$bus")
		USED_PORTS+="$port "
		[[ -n $bus ]] && USED_PORTS+="$((port + 10000)) "
		: >"$dir/redis.log"
		redis-server --port "$port" --bind 127.0.0.1 --protected-mode yes \
			--save '' --appendonly no --shutdown-timeout 0 --dir "$dir" --daemonize no \
			--logfile "$dir/redis.log" "$@" </dev/null >/dev/null 2>&1 &
		pid=$!
		SERVER_PIDS+=("$pid")
		for ((i = 0; i < START_TIMEOUT * 10; i++)); do
			if ! alive "$pid"; then
				break
			fi
			if [[ $(rcli "$port" PING 2>/dev/null) == PONG ]]; then
				log "$name: pid $pid on 127.0.0.1:$port"
				STARTED_PORT=$port
				return 0
			fi
			sleep 0.1
		done
		if alive "$pid"; then
			fail "$name: redis-server (pid $pid) did not answer PING on port $port within ${START_TIMEOUT}s"
		fi
		wait "$pid" 2>/dev/null || true
		if grep -qi 'address already in use' "$dir/redis.log"; then
			log "$name: port $port taken, retrying (attempt $attempt)"
			continue
		fi
		fail "$name: redis-server exited during startup"
	done
	fail "$name: could not start redis-server after 5 attempts"
}

# wait_until DESCRIPTION COMMAND... retries COMMAND until it succeeds or
# START_TIMEOUT seconds have passed.
wait_until() {
	local what=$1 i
	shift
	for ((i = 0; i < START_TIMEOUT * 10; i++)); do
		if "$@"; then
			return 0
		fi
		sleep 0.1
	done
	fail "timed out after ${START_TIMEOUT}s waiting for $what"
}

# info_has PORT SECTION LINE_REGEX succeeds when INFO SECTION has a line
# fully matching LINE_REGEX.
info_has() {
	local info
	info=$(rcli "$1" INFO "$2" 2>/dev/null | tr -d '\r') || return 1
	grep -qx -- "$3" <<<"$info"
}

has_replica() {
	info_has "$1" replication 'connected_slaves:[1-9][0-9]*'
}

replica_link_up() {
	info_has "$1" replication 'master_link_status:up'
}

cluster_ok() {
	local info
	info=$(rcli "$1" CLUSTER INFO 2>/dev/null | tr -d '\r') || return 1
	grep -qx 'cluster_state:ok' <<<"$info" &&
		grep -qx 'cluster_slots_ok:16384' <<<"$info" &&
		grep -qx 'cluster_known_nodes:3' <<<"$info"
}

main() {
	[[ $# -gt 0 ]] || die "usage: $PROG COMMAND [ARGS...]"
	ensure_redis
	check_redis_version

	TMP=$(mktemp -d "${TMPDIR:-/tmp}/contstore-redis.XXXXXX")
	log "scratch directory $TMP"

	local standalone primary replica a b c
	start_server standalone "" --
	standalone=$STARTED_PORT

	start_server primary "" -- --repl-diskless-sync-delay 0
	primary=$STARTED_PORT
	start_server replica "" -- --replicaof 127.0.0.1 "$primary"
	replica=$STARTED_PORT

	local cluster_args=(--cluster-enabled yes --cluster-config-file nodes.conf
		--cluster-node-timeout 2000)
	start_server cluster-a bus -- "${cluster_args[@]}"
	a=$STARTED_PORT
	start_server cluster-b bus -- "${cluster_args[@]}"
	b=$STARTED_PORT
	start_server cluster-c bus -- "${cluster_args[@]}"
	c=$STARTED_PORT

	# In the background so that a signal does not wait for it to finish, and
	# bounded, since redis-cli waits for the nodes to join without a limit.
	timeout "$((START_TIMEOUT * 2))" redis-cli --cluster create "127.0.0.1:$a" "127.0.0.1:$b" "127.0.0.1:$c" \
		--cluster-replicas 0 --cluster-yes </dev/null >"$TMP/cluster-create.log" 2>&1 &
	HELPER_PID=$!
	if ! wait "$HELPER_PID"; then
		HELPER_PID=""
		cat "$TMP/cluster-create.log" >&2
		fail "redis-cli --cluster create failed"
	fi
	HELPER_PID=""
	log "cluster created"

	wait_until "replica 127.0.0.1:$replica to sync" replica_link_up "$replica"
	wait_until "127.0.0.1:$primary to report a connected replica" has_replica "$primary"
	local p
	for p in "$a" "$b" "$c"; do
		wait_until "cluster node 127.0.0.1:$p to report cluster_state:ok" cluster_ok "$p"
	done
	log "replica in sync, cluster ok"

	export CONTSTORE_REDIS_ADDR="127.0.0.1:$standalone"
	export CONTSTORE_REDIS_REPLICATED_ADDR="127.0.0.1:$primary"
	export CONTSTORE_CLUSTER_ADDRS="127.0.0.1:$a,127.0.0.1:$b,127.0.0.1:$c"
	CONTSTORE_REDIS_SERVER=$(command -v redis-server)
	export CONTSTORE_REDIS_SERVER
	export CONTSTORE_REDIS_TMP="$TMP"
	log "CONTSTORE_REDIS_ADDR=$CONTSTORE_REDIS_ADDR"
	log "CONTSTORE_REDIS_REPLICATED_ADDR=$CONTSTORE_REDIS_REPLICATED_ADDR"
	log "CONTSTORE_CLUSTER_ADDRS=$CONTSTORE_CLUSTER_ADDRS"

	# Run the command in its own process group (job control on just for the
	# launch) so the whole tree can be stopped on interruption. The script
	# waits with the "wait" builtin, which returns as soon as a trapped signal
	# arrives.
	set -m
	"$@" &
	CMD_PID=$!
	CMD_PGID=$CMD_PID
	set +m
	local status=0
	wait "$CMD_PID" || status=$?
	CMD_PID=""
	return "$status"
}

main "$@"
