# Development tasks. Run "make" or "make help" for the list.
#
# Tests that need Redis get throwaway servers from scripts/redis-env.sh
# (standalone, standalone with a replica, 3-master cluster), which installs
# redis-server with apt-get when missing and running as root.

GO        ?= go
NPM       ?= npm
NODE      ?= node
PKGS      ?= ./...
TESTFLAGS ?=
FUZZTIME  ?= 60s
BENCH     ?= .
# bench starts Redis with REDIS=1, not with REDIS=0, and with REDIS=auto
# only when a selected benchmark is in a package of REDIS_BENCH_PKGS.
REDIS     ?= auto

REDIS_ENV := scripts/redis-env.sh
# The packages whose benchmarks need Redis.
REDIS_BENCH_PKGS := ./integration/

# Go files to format-check, without vendored code and test fixtures.
GOFILES = $(shell find . -type f -name '*.go' -not -path './vendor/*' -not -path '*/testdata/*' -not -path './.git/*')

.DEFAULT_GOAL := help

.PHONY: help test test-short e2e bench fuzz fmt fmt-check vet compose-check vectors-check

help: ## List the targets
	@echo 'Targets:'
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-14s %s\n", $$1, $$2}'
	@echo
	@echo 'Variables: PKGS=$(PKGS) TESTFLAGS=$(TESTFLAGS) FUZZTIME=$(FUZZTIME) BENCH=$(BENCH) REDIS=$(REDIS)'

test: fmt-check vet compose-check vectors-check ## Check formatting, vet, docker-compose.yml and the vectors (without Go), then run all tests with -race against real Redis
	$(REDIS_ENV) $(GO) test -race -count=1 -timeout 35m $(TESTFLAGS) $(PKGS)

# sq quotes $(1) for the inside of a single-quoted shell word.
sq = $(subst ','\'',$(1))

# go test shows nothing of a passing package's output, skip messages
# included. RUN_COUNTING_SKIPS prints and runs the command line $$wrap$$run
# with CONTSTORE_REDIS_SKIP_LOG set, so that every test skipped for want of
# Redis is listed (internal/redistest), then says how many $$what were
# skipped and exits with the command's status.
RUN_COUNTING_SKIPS = \
	echo "$${wrap:-}$$run"; \
	skips=$$(mktemp "$${TMPDIR:-/tmp}/contstore-skips.XXXXXX") || exit 1; \
	trap 'rm -f "$$skips"' EXIT; trap 'exit 130' INT TERM; \
	status=0; \
	export CONTSTORE_REDIS_SKIP_LOG="$$skips"; \
	eval "$${wrap:-}$$run" || status=$$?; \
	n=$$(wc -l <"$$skips" | tr -d ' '); \
	if [ "$$n" -gt 0 ]; then \
		[ "$$n" -gt 1 ] || what=$${what%s}; \
		in=$$(cut -f1 "$$skips" | sort -u | sed 's|^github.com/contstore/contstore/|./|' | paste -sd' ' -); \
		echo "$@: $$n $$what skipped: no Redis, in $$in ($$how)"; \
	fi; \
	exit $$status

test-short: ## Run the tests with -short and without Redis; ends with the count of tests skipped for want of Redis
	@run='$(call sq,$(GO) test -short $(TESTFLAGS) $(PKGS))'; \
	what=tests; how='run make test, or scripts/redis-env.sh go test ./...'; \
	$(RUN_COUNTING_SKIPS)

e2e: ## Run the end-to-end tests with real clients (installs them with npm)
	@lock=testdata/clients/node_modules/.package-lock.json; \
	if [ "$$lock" -nt testdata/clients/package-lock.json ] && [ "$$lock" -nt testdata/clients/package.json ]; then \
		echo 'e2e: the clients in testdata/clients/node_modules are up to date'; \
	elif ! command -v $(NPM) >/dev/null 2>&1; then \
		echo 'e2e: $(NPM) not found, the clients cannot be installed: the tests that need them are skipped (they fail with CI=true)'; \
	else \
		echo 'e2e: installing the clients (npm ci in testdata/clients)'; \
		cd testdata/clients && timeout 900 $(NPM) ci --no-audit --no-fund --loglevel=error; \
	fi
	$(GO) vet -tags e2e ./e2e
	GO='$(GO)' $(REDIS_ENV) $(GO) test -tags e2e -count=1 -timeout 35m -v $(TESTFLAGS) ./e2e

# With REDIS=auto, bench starts Redis when PKGS includes one of
# REDIS_BENCH_PKGS with a benchmark matching BENCH's top-level part (build
# errors are left to the run to report). A benchmark elsewhere that finds no
# Redis is skipped, and counted at the end.
bench: ## Run the benchmarks (BENCH=regexp), with real Redis when they need it (REDIS=auto|1|0)
	@need='$(REDIS)'; \
	if [ "$$need" = auto ]; then \
		need=0; \
		redis=$$($(GO) list $(REDIS_BENCH_PKGS)) && all=$$($(GO) list $(PKGS)) || exit 1; \
		pkgs=$$(printf '%s\n' "$$all" | grep -Fx -e "$$redis"); \
		top=$$(printf '%s' '$(call sq,$(BENCH))' | cut -d/ -f1); \
		if [ -n "$$pkgs" ] && $(GO) test -list "$${top:-.}" $$pkgs 2>/dev/null | grep -q '^Benchmark'; then need=1; fi; \
	fi; \
	case "$$need" in \
	1) wrap='$(REDIS_ENV) ' ;; \
	0) wrap= ;; \
	*) echo 'bench: REDIS=$(REDIS): want auto, 1 or 0' >&2; exit 2 ;; \
	esac; \
	run='$(call sq,$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem $(TESTFLAGS) $(PKGS))'; \
	what=benchmarks; how='REDIS=1 runs them'; \
	$(RUN_COUNTING_SKIPS)

fuzz: ## Run every fuzz target for FUZZTIME each (default 60s)
	GO='$(GO)' FUZZTIME='$(FUZZTIME)' scripts/fuzz.sh $(PKGS)

fmt: ## Format all Go files
	@gofmt -w $(GOFILES)

fmt-check: ## Fail, listing them, if Go files are not gofmt-formatted
	@files="$$(gofmt -l $(GOFILES))"; \
	if [ -n "$$files" ]; then \
		echo 'These files are not gofmt-formatted (run "make fmt"):'; \
		echo "$$files"; \
		exit 1; \
	fi

vet: ## Run go vet
	$(GO) vet $(PKGS)

# vectors-check replays testdata/vectors.json against a throwaway Redis with
# scripts/vectors.mjs, a client written in Node from PROTOCOL.md alone. Without
# node it is skipped, unless CI is true: then it fails.
vectors-check: ## Replay testdata/vectors.json against Redis with a non-Go client (scripts/vectors.mjs, Node 20)
	@if command -v $(NODE) >/dev/null 2>&1; then \
		echo '$(REDIS_ENV) $(NODE) scripts/vectors.mjs'; \
		$(REDIS_ENV) $(NODE) scripts/vectors.mjs; \
	else \
		case "$${CI:-}" in \
		1|t|T|true|TRUE|True) echo 'vectors-check: $(NODE) not found, and CI is set: failing (install Node 20)' >&2; exit 1 ;; \
		*) echo 'vectors-check: $(NODE) not found; skipped (install Node 20 to replay the vectors without Go)' ;; \
		esac; \
	fi

compose-check: ## Validate docker-compose.yml with docker-compose (skipped when it is not installed)
	@if command -v docker-compose >/dev/null 2>&1; then \
		docker-compose -f docker-compose.yml config -q && echo 'docker-compose.yml is valid'; \
	else \
		echo 'compose-check: docker-compose not installed (Debian: apt-get install docker-compose); skipped'; \
	fi

.PHONY: traces

traces: ## Capture real-client traces into testdata/clients (installs the clients with npm)
	GO='$(GO)' testdata/clients/capture.sh
