# Development tasks. Run "make" or "make help" for the list.
#
# Tests that need Redis get throwaway servers from scripts/redis-env.sh
# (standalone, standalone with a replica, 3-master cluster), which installs
# redis-server with apt-get when missing and running as root.

GO        ?= go
NPM       ?= npm
PKGS      ?= ./...
TESTFLAGS ?=
FUZZTIME  ?= 60s
BENCH     ?= .

REDIS_ENV := scripts/redis-env.sh

# Go files to format-check, without vendored code and test fixtures.
GOFILES = $(shell find . -type f -name '*.go' -not -path './vendor/*' -not -path '*/testdata/*' -not -path './.git/*')

.DEFAULT_GOAL := help

.PHONY: help test test-short e2e bench fuzz fmt fmt-check vet compose-check

help: ## List the targets
	@echo 'Targets:'
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-14s %s\n", $$1, $$2}'
	@echo
	@echo 'Variables: PKGS=$(PKGS) TESTFLAGS=$(TESTFLAGS) FUZZTIME=$(FUZZTIME) BENCH=$(BENCH)'

test: fmt-check vet compose-check ## Check formatting, vet, docker-compose.yml, then run all tests with -race against real Redis
	$(REDIS_ENV) $(GO) test -race -count=1 -timeout 20m $(TESTFLAGS) $(PKGS)

test-short: ## Run the tests with -short and without Redis (Redis tests are skipped)
	$(GO) test -short $(TESTFLAGS) $(PKGS)

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
	GO='$(GO)' $(REDIS_ENV) $(GO) test -tags e2e -count=1 -timeout 20m -v $(TESTFLAGS) ./e2e

bench: ## Run the benchmarks against real Redis (BENCH=regexp)
	$(REDIS_ENV) $(GO) test -run '^$$' -bench '$(BENCH)' -benchmem $(TESTFLAGS) $(PKGS)

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

compose-check: ## Validate docker-compose.yml with docker-compose (skipped when it is not installed)
	@if command -v docker-compose >/dev/null 2>&1; then \
		docker-compose -f docker-compose.yml config -q && echo 'docker-compose.yml is valid'; \
	else \
		echo 'compose-check: docker-compose not installed (Debian: apt-get install docker-compose); skipped'; \
	fi

.PHONY: traces

traces: ## Capture real-client traces into testdata/clients (installs the clients with npm)
	GO='$(GO)' testdata/clients/capture.sh
