package main

// One simulation: the replicas and owners of a run, set up from the
// configuration, and the workers that play it.

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/contstore/contstore/directory"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// sim is one run of the workload against one set of replica stores.
type sim struct {
	cfg      *config
	replicas []*replica
	byName   map[string]*replica
	dir      *directory.Directory
	owners   []*owner
	sched    scheduler
	oracle   *oracle
	idleGap  time.Duration

	rr             atomic.Uint64 // round-robin position
	turns          atomic.Int64  // reservations made
	continued      atomic.Int64  // turns the upstream continued
	announceErrors atomic.Int64  // failed directory announcements and withdrawals
}

// minIdleMargin is the least an idle gap outlasts the TTL by, so that the
// state has expired when its owner comes back: a state lives up to the
// TTL after its last turn, and the embedded Redis expires keys only every
// 250 ms (internal/embedded), later when the process is starved.
const minIdleMargin = time.Second

// Streams of the seed: each owner's is (seed, owner index); the
// scheduler's and the workers' (which pick owners and random routes, and
// so never change the workload) and the openings of -alike groups are set
// apart by the top bits.
const (
	openingStreams  = 1 << 61
	schedulerStream = 1 << 62
	workerStreams   = 1 << 63
)

// deployment is what a run plays on: one store per replica, the
// directory the replicas announce themselves in, and the stores that hold
// the run's state between them, read after it: one store shared by the
// replicas, or each replica's own.
type deployment struct {
	stores []*store.Store
	dir    *directory.Directory
	state  *store.Store   // the shared state's reader, when the replicas share it
	own    []*store.Store // each replica's own store, when they do not
}

// simulate runs the workload on d, shows progress on w, and returns what
// it delivered as deployment label.
func simulate(ctx context.Context, cfg *config, d deployment, label string, w io.Writer) runResult {
	gs := make([]gatewayStore, len(d.stores))
	for i, st := range d.stores {
		gs[i] = st
		if cfg.wrapStore != nil {
			gs[i] = cfg.wrapStore(st)
		}
	}
	s := newSim(cfg, gs, d.dir)
	withdraw := s.announce(ctx)
	stop := showProgress(w, s, label)
	workers, elapsed := s.run(ctx)
	stop()
	withdraw()
	res := s.result(label, workers, elapsed)
	holders := d.own
	if d.state != nil {
		holders = []*store.Store{d.state}
	}
	state, err := storeState(context.WithoutCancel(ctx), holders)
	if err != nil {
		res.StateError = err.Error()
	}
	res.State = state
	return res
}

// newSim sets up replicas over stores, finding each other in dir, and the
// owners of cfg's conversations with their turns: -turns split evenly, so
// that each owner plays the same turns whatever the concurrency.
func newSim(cfg *config, stores []gatewayStore, dir *directory.Directory) *sim {
	issued := &responses{}
	s := &sim{
		cfg:     cfg,
		byName:  map[string]*replica{},
		dir:     dir,
		idleGap: cfg.ttl + max(cfg.ttl/5, minIdleMargin),
	}
	for i, st := range stores {
		r := &replica{name: replicaName(i), store: st, up: newUpstream(cfg.upstream, issued, cfg.sockets)}
		s.replicas = append(s.replicas, r)
		s.byName[r.name] = r
	}
	for c := range cfg.conversations {
		session := fmt.Sprintf("conv-%d", c)
		if cfg.alike > 1 {
			s.addAlike(c)
		} else {
			s.addOwner(identity.Main(session))
		}
		for k := range cfg.agents {
			s.addOwner(identity.Agent(session, fmt.Sprintf("agent-%d", k+1)))
		}
	}
	s.oracle = &oracle{issued: issued, owners: s.owners}
	n := int64(len(s.owners))
	for _, o := range s.owners {
		o.left = math.MaxInt64
		if cfg.turns > 0 {
			o.left = cfg.turns / n
			if int64(o.index) < cfg.turns%n {
				o.left++
			}
		}
		if o.left > 0 {
			s.sched.free = append(s.sched.free, o)
		}
	}
	s.sched.rng = rand.New(rand.NewPCG(cfg.seed, schedulerStream))
	s.sched.cutAtEnd = cfg.turns > 0
	return s
}

// addOwner adds the owner id; its names are always valid.
func (s *sim) addOwner(id identity.Owner, err error) {
	if err != nil {
		panic(err)
	}
	s.addThread(id, id.Key())
}

// addThread adds a conversation thread whose turns go to the store
// owner id, on the upstream socket client hashes to.
func (s *sim) addThread(id identity.Owner, client string) *owner {
	h := fnv.New64a()
	h.Write([]byte(client))
	i := len(s.owners)
	o := &owner{
		index:  i,
		id:     id,
		rng:    rand.New(rand.NewPCG(s.cfg.seed, uint64(i))),
		socket: h.Sum64()%uint64(s.cfg.sockets) + 1,
		home:   id.Partition(len(s.replicas)),
	}
	o.initPrompt(s.cfg.upstream == anySocket)
	s.owners = append(s.owners, o)
	return o
}

// addAlike adds the main thread of conversation c, one of a group of
// -alike that name no session and open alike: the same prompt and first
// user message, under one credential. A gateway derives one owner from
// that opening (proxy.Identity.Owner), so the group's main threads share
// it; each keeps its own client, socket and transcript.
func (s *sim) addAlike(c int) {
	group := c / s.cfg.alike
	id, err := identity.Main(fmt.Sprintf("alike-%d", group))
	if err != nil {
		panic(err)
	}
	o := s.addThread(id, fmt.Sprintf("conv-%d", c))
	o.shared = true
	o.opening = userMessage(rand.New(rand.NewPCG(s.cfg.seed, openingStreams|uint64(group))), "")
}

// run runs the workers until every owner has played its turns, the
// duration is spent or ctx ends, and returns them with the time it took.
func (s *sim) run(ctx context.Context) ([]*worker, time.Duration) {
	// Store calls use ctx; the duration only stops workers from starting
	// turns, so that the last turns are not cut short.
	loop := ctx
	if s.cfg.duration > 0 {
		var cancel context.CancelFunc
		loop, cancel = context.WithTimeout(ctx, s.cfg.duration)
		defer cancel()
	}
	workers := make([]*worker, s.cfg.concurrency)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range workers {
		w := newWorker(s, i)
		workers[i] = w
		wg.Go(func() { w.loop(loop, ctx) })
	}
	wg.Wait()
	return workers, time.Since(start)
}

// route picks the replica that receives a request of o.
func (s *sim) route(o *owner, rng *rand.Rand) *replica {
	switch s.cfg.routing {
	case sticky:
		return s.replicas[o.home]
	case random:
		return s.replicas[rng.IntN(len(s.replicas))]
	}
	return s.replicas[(s.rr.Add(1)-1)%uint64(len(s.replicas))]
}
