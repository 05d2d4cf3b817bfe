package redisconn

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterReloadInterval is the least time between two slot map reloads a
// clusterRefresher asks for, whatever the error rate.
const clusterReloadInterval = 200 * time.Millisecond

// clusterRefresher asks a Redis Cluster client to reload its slot map when
// an operation fails in a way that says the map may be stale.
//
// go-redis reloads the map by itself on MOVED and ASK replies, and
// otherwise every ClusterStateReloadInterval (60 s by default). A master
// that dies answers neither: its connections reset and new ones are
// refused, so without a reload the client keeps sending that master's
// slots to the dead address long after a replica took them over. The
// refresher closes that gap: on an error that a failover, a failed node or
// a slot change can explain it calls ClusterClient.ReloadState, at most
// once per interval.
//
// ReloadState does not block: go-redis reloads on a goroutine of its own,
// one at a time, and folds requests that arrive during a reload into one
// more reload after it. observe itself takes no lock and starts no
// goroutine: on the error path it costs one clock read and an atomic load
// (and a compare-and-swap once per interval).
//
// The zero of a *clusterRefresher, nil, is valid and does nothing: that is
// what newClusterRefresher returns for a client that is not a
// *redis.ClusterClient.
type clusterRefresher struct {
	reload   func() // asks for a reload; must not block
	now      func() time.Time
	interval time.Duration
	start    time.Time    // origin of next, read on the monotonic clock
	next     atomic.Int64 // earliest next reload, in ns since start
	reloads  atomic.Int64 // reloads asked for
}

// newClusterRefresher returns a refresher for c, or nil when c is not a
// Redis Cluster client.
func newClusterRefresher(c redis.UniversalClient) *clusterRefresher {
	cc, ok := c.(*redis.ClusterClient)
	if !ok || cc == nil {
		return nil
	}
	return newRefresher(func() { cc.ReloadState(context.Background()) }, time.Now, clusterReloadInterval)
}

func newRefresher(reload func(), now func() time.Time, interval time.Duration) *clusterRefresher {
	return &clusterRefresher{reload: reload, now: now, interval: interval, start: now()}
}

// observe looks at the error of a command or script and asks for a reload
// of the slot map when the error says it may be stale and no reload was
// asked for within the interval. It is safe for concurrent use and returns
// at once; nil errors and a nil refresher cost nothing.
func (r *clusterRefresher) observe(err error) {
	if r == nil || err == nil || !staleSlotMap(err) {
		return
	}
	at := int64(r.now().Sub(r.start))
	next := r.next.Load()
	if at < next || !r.next.CompareAndSwap(next, at+int64(r.interval)) {
		return
	}
	r.reloads.Add(1)
	r.reload()
}

// staleSlotMap reports whether err, from a command sent through a Redis
// Cluster client, may mean the client's slot map no longer matches the
// cluster:
//
//   - the node's connection failed: refused, reset, closed (EOF), timed
//     out, unreachable. The node may be dead or cut off, and a replica may
//     already serve its slots. go-redis retries such errors on the same
//     node and then gives up, without reloading.
//   - the operation's deadline passed (context.DeadlineExceeded). With
//     ContextTimeoutEnabled, a node that stopped answering shows up as
//     this rather than as an i/o timeout, since go-redis checks the
//     context between retries.
//   - CLUSTERDOWN (the node serves none of the slot, or the cluster
//     lost coverage), TRYAGAIN (a slot in migration), LOADING (a node
//     that restarted, or a replica just attached), READONLY or
//     MASTERDOWN (the node is, or follows, a replica, as after a
//     failover).
//
// It does not for errors that say nothing about where slots live: script
// and command errors, redis.Nil, MOVED and ASK (go-redis follows them and
// reloads by itself), a closed client, a full connection pool (a local
// limit: the errors of the calls holding the connections decide), the
// caller's cancellation, and the store's own errors.
func staleSlotMap(err error) bool {
	switch {
	case err == nil,
		errors.Is(err, redis.Nil),
		errors.Is(err, context.Canceled),
		errors.Is(err, redis.ErrClosed),
		errors.Is(err, redis.ErrPoolTimeout),
		errors.Is(err, redis.ErrPoolExhausted):
		return false
	case redis.IsClusterDownError(err),
		redis.IsTryAgainError(err),
		redis.IsLoadingError(err),
		redis.IsReadOnlyError(err),
		redis.IsMasterDownError(err):
		return true
	}
	var redisErr redis.Error
	if errors.As(err, &redisErr) {
		return false // any other reply of the server, MOVED and ASK included
	}
	var netErr net.Error
	var opErr *net.OpError
	switch {
	case errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH),
		errors.As(err, &opErr),
		errors.As(err, &netErr) && netErr.Timeout():
		return true
	}
	return false
}
