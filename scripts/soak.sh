#!/usr/bin/env bash
# soak.sh runs the soak of RELIABILITY.md ("Soak: mixed turns and hostile
# clients"): it builds contproxy, the fake upstream and the soak driver
# (internal/cmd/soak), starts the fake upstream and contproxy on 127.0.0.1,
# runs the driver for $SOAK_DURATION (default 10m) and stops the two
# servers it started. It needs Redis from scripts/redis-env.sh:
#
#   scripts/redis-env.sh scripts/soak.sh [DRIVER FLAGS...]
#
# Extra arguments go to the driver (go run ./internal/cmd/soak -h), and
# $SOAK_CONTPROXY_FLAGS to contproxy after the flags below. The exit
# status is the driver's: non-zero when a well-behaved client saw an
# error. Logs go to a scratch directory, kept and named on failure or
# with SOAK_KEEP=1.
#
# The fake upstream runs as its own process, not as contproxy
# -fake-upstream: it keeps every stored response for ever (several
# hundred MB by the end of a run), which would show as contproxy's
# memory. contproxy talks to it over the WebSocket mode, so that
# credentials' socket pools come and go. The limits are shortened so that
# every hostile client is dropped, and comes back, many times within the
# run:
#   -body-timeout 5s -write-timeout 5s   slow bodies and unread streams, every 5-15 s
#   -idle-timeout 10s                    idle keep-alive connections, every 10 s
#   -socket-idle-timeout 30s             quiet credentials' sockets close
#   -max-credentials 128                 the bursts of new keys evict the least recently used
#   -max-body 24 MiB                     about half the 20-30 MB bodies get 413
#   -max-bytes-in-flight 128 MiB         two big bodies (up to 87 MB each) do not fit at once: 503
set -euo pipefail

: "${CONTSTORE_REDIS_ADDR:?run it under scripts/redis-env.sh: scripts/redis-env.sh scripts/soak.sh}"
readonly DURATION=${SOAK_DURATION:-10m}
cd "$(dirname "$0")/.."

DIR=$(mktemp -d "${TMPDIR:-/tmp}/contstore-soak.XXXXXX")
PIDS=()
STATUS=1

cleanup() {
	trap '' INT TERM
	local p
	for p in "${PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in "${PIDS[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	if [[ $STATUS -ne 0 || ${SOAK_KEEP:-0} != 0 ]]; then
		echo "soak.sh: logs kept in $DIR" >&2
	else
		rm -rf -- "$DIR"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

go build -o "$DIR/contproxy" ./cmd/contproxy
go build -o "$DIR/fakeupstream" ./internal/cmd/fakeupstream
go build -o "$DIR/soak" ./internal/cmd/soak

# wait_for FILE PATTERN prints the first line of FILE matching PATTERN,
# waiting up to 10 s for it.
wait_for() {
	local i line
	for ((i = 0; i < 100; i++)); do
		if line=$(grep -m1 -E -- "$2" "$1" 2>/dev/null); then
			printf '%s\n' "$line"
			return 0
		fi
		sleep 0.1
	done
	echo "soak.sh: nothing matching '$2' in $1 after 10 s" >&2
	cat "$1" >&2
	return 1
}

"$DIR/fakeupstream" -listen 127.0.0.1:0 -tool-calls 2 >"$DIR/fakeupstream.out" 2>"$DIR/fakeupstream.log" &
PIDS+=("$!")
FAKE=$(wait_for "$DIR/fakeupstream.out" '^127\.0\.0\.1:[0-9]+$')

"$DIR/contproxy" -listen 127.0.0.1:0 -ops-listen 127.0.0.1:0 \
	-upstream "ws://$FAKE/v1" -transport websocket -redis "redis://$CONTSTORE_REDIS_ADDR/0" \
	-body-timeout 5s -write-timeout 5s -idle-timeout 10s \
	-socket-idle-timeout 30s -max-credentials 128 \
	-max-body $((24 << 20)) -max-bytes-in-flight $((128 << 20)) \
	${SOAK_CONTPROXY_FLAGS:-} 2>"$DIR/contproxy.log" &
PIDS+=("$!")
LINE=$(wait_for "$DIR/contproxy.log" 'msg="contproxy listening"')
ADDR=$(sed -E 's/.* addr=([^ ]+).*/\1/' <<<"$LINE")
OPS=$(sed -E 's/.* ops=([^ ]+).*/\1/' <<<"$LINE")
echo "soak.sh: contproxy (pid ${PIDS[1]}) on $ADDR, operations port $OPS, fake upstream on $FAKE; running $DURATION"

STATUS=0
"$DIR/soak" -url "http://$ADDR" -ops "http://$OPS" -duration "$DURATION" "$@" || STATUS=$?
if [[ -r /proc/${PIDS[0]}/status ]]; then
	echo "soak.sh: the fake upstream's RSS: $(awk '/^VmRSS/ { print $2, $3 }' "/proc/${PIDS[0]}/status")"
fi
echo "soak.sh: contproxy logged $(grep -c 'level=WARN' "$DIR/contproxy.log" || true) warnings, $(grep -c 'level=ERROR' "$DIR/contproxy.log" || true) errors"
exit "$STATUS"
