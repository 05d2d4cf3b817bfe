// Package integration holds tests that run against real Redis servers: a
// standalone primary without replicas, a standalone primary with one replica
// and a 3-master Redis Cluster, all on loopback.
//
// "make test" starts these servers through scripts/redis-env.sh and passes
// their addresses in CONTSTORE_REDIS_ADDR, CONTSTORE_REDIS_REPLICATED_ADDR and
// CONTSTORE_CLUSTER_ADDRS (see package internal/redistest). Without those
// variables the tests are skipped, unless CI=true, in which case they fail.
//
// To run only this package against fresh servers:
//
//	scripts/redis-env.sh go test -race -count=1 ./integration/
package integration
