//go:build e2e

// Package e2e tests the continuation proxy (cmd/contproxy) end to end with
// real clients: the Codex CLI, the OpenAI JS SDK, the Agents SDK, the
// Vercel AI SDK, opencode and the official Go SDK hold their conversations
// through a round-robin reverse proxy in front of contproxy replicas
// sharing one Redis, which forward to the scripted fake upstream
// (internal/cmd/fakeupstream). Every server
// listens on 127.0.0.1 and every client run is bounded in time. Like a
// load balancer with passive health checks, the round-robin proxy sends a
// request that cannot reach its replica to the next one and skips the
// failed replica for a while.
//
// The tests are behind the build tag e2e:
//
//	make e2e
//	scripts/redis-env.sh go test -tags e2e -count=1 -timeout 20m -v ./e2e
//
// They need node with the clients pinned in testdata/clients installed
// ("npm ci" there, which make e2e runs; opencode's binary packages are for
// Linux x64) and a Redis server at
// CONTSTORE_REDIS_ADDR (scripts/redis-env.sh starts one). When something is
// missing the tests are skipped, or fail with CI=true. E2E_REPORT names a
// file to write the measured tables to, as markdown.
//
// TestClients runs every client in each scenario of a matrix: straight to
// the fake upstream (the baseline), an HTTP upstream with store=true behind
// two replicas, a WebSocket upstream with store=false behind one and
// behind two replicas, and behind four replicas that forward a turn to the
// replica holding its upstream socket. Each client must succeed and get no
// error; the upstream must have answered each request once, resolving a
// conversation of exactly the items the client sent; contproxy's own
// counters must agree. From the fake upstream's trace it measures how many
// later turns were continued with previous_response_id and how much of the
// full context was sent upstream, and requires enough continuations where
// the scenario allows them. TestReplicaKilled kills, between two requests
// of a conversation, the forwarding replica holding its socket, and checks
// that only the turn that continued from it goes with the full context.
// TestForgedForward checks that a replica refuses forged forwarded turns
// without sending anything upstream. TestAddedLatency measures the latency
// a contproxy adds to a turn, with in-process and with Redis state.
//
// TestNextClients runs the Vercel AI SDK (generateText and streamText, store
// as shipped and store:false) and opencode (run, then run --continue)
// through two replicas, with an HTTP upstream that keeps responses and with
// a WebSocket upstream, store:false and forwarding, and requires at least
// 95% of the later turns continued where the upstream can continue them. A
// later turn is every request after its conversation's first, a
// conversation being an owner and a prompt, so that opencode's title
// generation under its session id is a conversation of its own.
// TestTwoCredentialsOneSession checks that requests of another credential
// under the same session id neither continue nor disturb a conversation's
// continuations. TestUpstreamKeepsNoResponses checks that, in front of an
// upstream that keeps no responses, the replicas stop trying
// continuations after the first refusals. TestCodexWebSocket runs Codex
// with its built-in OpenAI provider pointed at contproxy, over the
// WebSocket mode that contproxy serves its clients, through two replicas
// with forwarding: no fallback to HTTP, and at least 95% of the later turns
// of each connection continued.
// TestCodexSignedInWithChatGPTSendsZstdTurnsThatContinue runs Codex signed
// in with ChatGPT (an auth.json of fake tokens), which sends its HTTP
// turns with Content-Encoding zstd, through one replica over a WebSocket
// upstream: every turn zstd-encoded and answered 200, the upstream given
// them decoded, at least 95% of the later turns continued.
// TestJSSDKOtherEndpoints runs the OpenAI JS
// SDK's models.list(), responses.inputTokens.count() and, after creating a
// stored response, responses.retrieve() through two replicas, over each
// upstream transport: from the fake upstream's request log (its -requests
// flag), each reached the upstream once with the method, path, headers
// (the API key among them) and body the SDK sent, the SDK returned the
// upstream's answer, and no counter of contproxy's moved for them.
package e2e
