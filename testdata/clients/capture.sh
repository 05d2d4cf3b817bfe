#!/usr/bin/env bash
# Captures the traffic of real OpenAI clients against the fake Responses
# upstream (internal/cmd/fakeupstream) as JSONL traces in testdata/clients:
# one line per upstream call, see internal/fakeupstream.Recorder.
#
#   testdata/clients/capture.sh [CLIENT...]    (or: make traces)
#
# CLIENT is one of jssdk, agents, codex, aisdk, opencode; all of them
# without one. It installs the pinned clients into
# testdata/clients/node_modules with npm ci, builds the fake upstream, and
# for each client run starts a fresh upstream on 127.0.0.1 with its own
# trace file, runs the client with a timeout, then stops that upstream.
# The traces replace the committed ones only when every run succeeded.
#
# Environment: GO (default go), NPM (default npm), CLIENT_TIMEOUT (seconds
# per client run, default 300).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
GO=${GO:-go}
NPM=${NPM:-npm}
CLIENT_TIMEOUT=${CLIENT_TIMEOUT:-300}

work=$(mktemp -d "${TMPDIR:-/tmp}/contstore-traces.XXXXXX")
upstream_pid=
cleanup() {
	if [ -n "$upstream_pid" ]; then
		kill -TERM "$upstream_pid" 2>/dev/null || true
		wait "$upstream_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf 'capture: %s\n' "$*" >&2; }
die() {
	log "$*"
	exit 1
}

all_clients=(jssdk agents codex aisdk opencode)
selected=("$@")
[ ${#selected[@]} -gt 0 ] || selected=("${all_clients[@]}")
for c in "${selected[@]}"; do
	case " ${all_clients[*]} " in
	*" $c "*) ;;
	*) die "unknown client $c: want some of ${all_clients[*]}" ;;
	esac
done
# wanted CLIENT: tells whether CLIENT's traces are to be captured.
wanted() { case " ${selected[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac }

# --- clients and upstream --------------------------------------------------

log "installing the clients (npm ci)"
(cd "$here" && timeout 900 "$NPM" ci --no-audit --no-fund --loglevel=error) ||
	die "npm ci failed"
codex=$here/node_modules/.bin/codex
! wanted codex || [ -x "$codex" ] || die "codex is not installed in $here/node_modules"
! wanted opencode || [ -x "$here/node_modules/opencode-linux-x64/bin/opencode" ] ||
	[ -x "$here/node_modules/opencode-linux-x64-baseline/bin/opencode" ] ||
	die "opencode is not installed in $here/node_modules (its binary packages are for Linux x64)"

log "building the fake upstream"
(cd "$root" && timeout 600 "$GO" build -o "$work/fakeupstream" ./internal/cmd/fakeupstream) ||
	die "building the fake upstream failed"

# start_upstream TRACE [FLAGS...]: starts a fresh fake upstream recording to
# TRACE and sets base_url.
start_upstream() {
	local trace=$1
	shift
	rm -f "$trace" "$work/addr"
	"$work/fakeupstream" -listen 127.0.0.1:0 -trace "$trace" "$@" >"$work/addr" 2>>"$work/upstream.log" &
	upstream_pid=$!
	local i
	for i in $(seq 100); do
		if [ -s "$work/addr" ]; then
			base_url="http://$(head -n1 "$work/addr")/v1"
			return 0
		fi
		kill -0 "$upstream_pid" 2>/dev/null || die "the fake upstream exited: $(tail -n5 "$work/upstream.log")"
		sleep 0.1
	done
	die "the fake upstream did not start within 10 s"
}

stop_upstream() {
	kill -TERM "$upstream_pid"
	wait "$upstream_pid" || die "the fake upstream failed: $(tail -n5 "$work/upstream.log")"
	upstream_pid=
}

# client ENV... -- CMD...: runs a client with a timeout, without the
# caller's OpenAI credentials or endpoints, its output kept for the log.
client() {
	timeout --kill-after=10 "$CLIENT_TIMEOUT" env -u OPENAI_API_KEY -u OPENAI_BASE_URL -u OPENAI_ORG_ID \
		-u OPENAI_PROJECT_ID FAKE_API_KEY=fake-key OPENAI_AGENTS_DISABLE_TRACING=1 "$@" </dev/null
}

# traces are the traces captured, each as DIR/NAME (DIR relative to
# testdata/clients, NAME.jsonl the file), written to $work/NAME.jsonl.
traces=()

# --- JS SDK and Agents SDK -------------------------------------------------

if wanted jssdk; then
	for pattern in create-stream create stream-helper; do
		log "OpenAI JS SDK: $pattern"
		start_upstream "$work/jssdk-$pattern.jsonl" -tool-calls 2
		(cd "$here" && client FAKE_BASE_URL="$base_url" node jssdk.mjs "$pattern") ||
			die "jssdk.mjs $pattern failed"
		stop_upstream
		traces+=("./jssdk-$pattern")
	done
fi

if wanted agents; then
	log "OpenAI Agents SDK"
	start_upstream "$work/agents.jsonl" -tool-calls 2
	(cd "$here" && client FAKE_BASE_URL="$base_url" node agents.mjs) || die "agents.mjs failed"
	stop_upstream
	traces+=(./agents)
fi

# --- Vercel AI SDK and opencode ------------------------------------------

if wanted aisdk; then
	for mode in generate stream; do
		for store in shipped nostore; do
			name=aisdk-$mode
			[ "$store" = shipped ] || name=$name-$store
			log "Vercel AI SDK: $mode, store $store"
			start_upstream "$work/$name.jsonl" -tool-calls 2
			(cd "$here" && client FAKE_BASE_URL="$base_url" node aisdk.mjs "$mode" "$store") ||
				die "aisdk.mjs $mode $store failed"
			stop_upstream
			traces+=("./$name")
		done
	done
	log "Vercel AI SDK: generate with a session-id header"
	start_upstream "$work/aisdk-generate-session.jsonl" -tool-calls 2
	(cd "$here" && client FAKE_BASE_URL="$base_url" FAKE_SESSION_ID=aisdk-generate-session node aisdk.mjs generate) ||
		die "aisdk.mjs generate with a session id failed"
	stop_upstream
	traces+=(./aisdk-generate-session)
fi

if wanted opencode; then
	# opencode run, then run --continue twice, in $work/opencode.
	log "opencode"
	start_upstream "$work/opencode.jsonl" -tool-calls 2
	(cd "$here" && client FAKE_BASE_URL="$base_url" node opencode.mjs "$work/opencode") ||
		die "opencode.mjs failed"
	stop_upstream
	traces+=(./opencode)
fi

# --- Codex CLI -------------------------------------------------------------

# codex_run NAME SUMMARY: one Codex session (exec, then resumed user
# turns) with model_reasoning_summary = SUMMARY, in a fresh CODEX_HOME.
codex_run() {
	local name=$1 summary=$2
	local home=$work/$name/home cwd=$work/$name/work
	mkdir -p "$home" "$cwd"
	start_upstream "$work/$name.jsonl" -tool-calls 2
	cat >"$home/config.toml" <<-EOF
		model = "gpt-5.5"
		model_provider = "fake"
		model_reasoning_summary = "$summary"
		approval_policy = "never"
		sandbox_mode = "danger-full-access"
		check_for_update_on_startup = false

		[analytics]
		enabled = false

		[model_providers.fake]
		name = "Fake upstream"
		base_url = "$base_url"
		wire_api = "responses"
		env_key = "FAKE_API_KEY"
		supports_websockets = false
		request_max_retries = 0
		stream_max_retries = 0
	EOF
	local flags=(--skip-git-repo-check --dangerously-bypass-approvals-and-sandbox --color never)
	local prompts=(
		"Show me where we are and what is here."
		"Run the same checks again, please."
		"One more time, then tell me you are done."
		"Last one: what did all that print?"
	)
	local i out
	for i in "${!prompts[@]}"; do
		log "Codex ($name): user turn $((i + 1))"
		out=$work/$name/turn$i.out
		if [ "$i" -eq 0 ]; then
			(cd "$cwd" && client CODEX_HOME="$home" HOME="$work/$name" "$codex" exec "${flags[@]}" "${prompts[$i]}") \
				>"$out" 2>"$out.err" || die "codex exec failed: $(tail -n20 "$out.err")"
		else
			(cd "$cwd" && client CODEX_HOME="$home" HOME="$work/$name" "$codex" exec "${flags[@]}" resume --last "${prompts[$i]}") \
				>"$out" 2>"$out.err" || die "codex exec resume failed: $(tail -n20 "$out.err")"
		fi
		grep -q 'Done with message' "$out" || die "codex printed no final message: $(tail -n20 "$out.err")"
		sed 's/^/  codex: /' "$out" >&2
	done
	stop_upstream
}

if wanted codex; then
	codex_run codex-summary detailed
	codex_run codex-nosummary none
	traces+=(./codex-summary ./codex-nosummary)
fi

# --- checks, then the traces replace the committed ones --------------------

for trace in "${traces[@]}"; do
	name=${trace#*/}
	lines=$(wc -l <"$work/$name.jsonl")
	[ "$lines" -gt 0 ] || die "$name: empty trace"
	case $name in
	codex-*) min=9 ;;    # at least 8 turns after the first
	opencode) min=10 ;;  # a title, then 3 user turns of 3 calls
	aisdk-*) min=9 ;;    # 3 user turns of 3 calls
	*) min=6 ;;
	esac
	[ "$lines" -ge "$min" ] || die "$name: $lines calls, want at least $min"
done
for trace in "${traces[@]}"; do
	dir=${trace%%/*} name=${trace#*/}
	mv "$work/$name.jsonl" "$here/$dir/$name.jsonl"
	log "$(printf '%-34s %3d lines %8d bytes' "$trace.jsonl" "$(wc -l <"$here/$dir/$name.jsonl")" "$(wc -c <"$here/$dir/$name.jsonl")")"
done
