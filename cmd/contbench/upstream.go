package main

import (
	"strconv"
	"strings"
	"sync"
)

// responses registers every response the simulated upstream produces, with
// the owner it answered. Ids are "resp_<n>", n counting from 1, so the
// registry is one small slice however long the run.
type responses struct {
	mu     sync.Mutex
	owners []int32 // owners[n-1] is the index of the owner of resp_<n>
}

// add registers a new response for the owner of index owner and returns
// its id.
func (r *responses) add(owner int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.owners = append(r.owners, int32(owner))
	return "resp_" + strconv.Itoa(len(r.owners))
}

// ownerOf returns the index of the owner response id answered, or false
// when the upstream never produced id.
func (r *responses) ownerOf(id string) (int, bool) {
	digits, ok := strings.CutPrefix(id, "resp_")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n < 1 || n > len(r.owners) {
		return 0, false
	}
	return int(r.owners[n-1]), true
}

// sendOutcome is how the upstream answers a request.
type sendOutcome int

// Upstream answers.
const (
	// answered: a new response was produced.
	answered sendOutcome = iota
	// notFound: previous_response_not_found; nothing was produced.
	notFound
	// failed: the upstream failed the request.
	failed
)

// upstream is the model provider as one replica's connections see it:
// sockets 1..n, each remembering only its most recent response (the
// Responses WebSocket mode rule with store=false), and, with store=true,
// every response ever produced.
type upstream struct {
	mode   upstreamMode
	issued *responses
	mu     sync.Mutex
	latest []string // latest[s] is socket s's latest response; "" when none
}

// newUpstream returns the connections of a replica with sockets sockets.
func newUpstream(mode upstreamMode, issued *responses, sockets int) *upstream {
	return &upstream{mode: mode, issued: issued, latest: make([]string, sockets+1)}
}

// send sends a request of the owner of index owner on socket, continuing
// response prev unless prev is empty. lost makes the socket reconnect,
// forgetting its response, before the request; fail makes the upstream
// fail the request, which also evicts the socket's response.
func (u *upstream) send(owner int, socket uint64, prev string, lost, fail bool) (string, sendOutcome) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if lost || fail {
		u.latest[socket] = ""
	}
	if fail {
		return "", failed
	}
	if prev != "" {
		known := u.latest[socket] == prev
		if u.mode == anySocket {
			_, known = u.issued.ownerOf(prev)
		}
		if !known {
			return "", notFound
		}
	}
	id := u.issued.add(owner)
	u.latest[socket] = id
	return id, answered
}
