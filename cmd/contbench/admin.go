package main

// The set-up and clean-up of a namespace: its emptiness check, warm-up,
// schema and state reads. They go through a store of their own whose
// calls have a generous timeout, so that a loaded machine or a short
// -op-timeout cannot fail them; only the measured turns use -op-timeout.

import (
	"context"
	"fmt"
	"time"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// adminTimeout bounds each store call of the set-up and clean-up.
const adminTimeout = 30 * time.Second

// schemaWait bounds how long the replicas' stores are given to read the
// namespace's schema before a run: time for a few of their checks, which
// run at most once a second.
const schemaWait = 3 * time.Second

// adminOptions returns the options of the store that sets namespace ns up
// and reads its state: the replicas' options with adminTimeout and no
// circuit breaker.
func (c *config) adminOptions(ns string) store.Options {
	o := c.storeOptions("contbench")
	o.Namespace, o.OpTimeout, o.BreakerFailures = ns, adminTimeout, -1
	return o
}

// openAdmin opens the admin store of namespace ns on the target's admin
// client, which records the namespace's schema, and checks that ns holds
// no continuation state yet.
func (t *target) openAdmin(ctx context.Context, cfg *config, ns string) (*store.Store, error) {
	s, err := store.NewRedis(t.admin, cfg.adminOptions(ns))
	if err != nil {
		return nil, err
	}
	if err := checkEmpty(ctx, s, ns); err != nil {
		return nil, err
	}
	return s, nil
}

// checkEmpty returns an error unless the store s of namespace ns holds no
// continuation state.
func checkEmpty(ctx context.Context, s *store.Store, ns string) error {
	st, err := s.Stats(ctx)
	if err != nil {
		return fmt.Errorf("reading namespace %q: %w", ns, err)
	}
	if tot := st.Total; tot.Owners > 0 || tot.StoredBytes > 0 || tot.Evictions.Total() > 0 {
		return fmt.Errorf("namespace %q already holds continuation state (%d owners): give contbench a namespace of its own",
			ns, tot.Owners)
	}
	return nil
}

// warmUp runs each store operation once in every partition, on throwaway
// owners it then removes: a server allocates some memory on its first use
// of each command (the scripts' included), and that is no owner's.
func warmUp(ctx context.Context, s *store.Store) error {
	req, err := s.ParseRequest(probeBody)
	if err != nil {
		return err
	}
	partitions := s.Options().Partitions
	warm := make([]bool, partitions)
	for i, left := 0, partitions; left > 0; i++ {
		owner, err := identity.Main(fmt.Sprintf("contbench-warm-up-%d", i))
		if err != nil {
			return err
		}
		p := owner.Partition(partitions)
		if warm[p] {
			continue
		}
		warm[p] = true
		left--
		if err := warmOwner(ctx, s, owner, req); err != nil {
			return err
		}
	}
	_, err = s.Sweep(ctx)
	return err
}

// warmOwner plays a published turn, an aborted one and a pending one of
// owner, then clears its state.
func warmOwner(ctx context.Context, s *store.Store, owner identity.Owner, req *fingerprint.Request) error {
	if res := s.Reserve(ctx, owner, req); res.Err != nil {
		return res.Err
	} else if _, err := s.Record(ctx, res, probeResult); err != nil {
		return err
	}
	if res := s.Reserve(ctx, owner, req); res.Err != nil {
		return res.Err
	} else if _, err := s.Abort(ctx, res); err != nil {
		return err
	}
	if res := s.Reserve(ctx, owner, req); res.Err != nil {
		return res.Err
	}
	return s.Clear(ctx, owner)
}

// awaitSchema waits, up to schemaWait, until every store of stores parses
// requests under the namespace's fingerprint key, which admin, the store
// that set the namespace up, holds. A store reads the key in its schema
// check, which runs within -op-timeout when the store opens and, while it
// fails, again on the store's calls at most once a second; until then the
// store's turns do not continue. It returns how many stores have not read
// the key.
func awaitSchema(ctx context.Context, stores []*store.Store, admin *store.Store) (int, error) {
	want, err := admin.ParseRequest(probeBody)
	if err != nil {
		return 0, err
	}
	owner, err := identity.Main("contbench-schema")
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(schemaWait)
	for {
		behind := 0
		for _, s := range stores {
			got, err := s.ParseRequest(probeBody)
			if err != nil {
				return 0, err
			}
			if got.Signature() != want.Signature() {
				behind++
				_, _ = s.Inspect(ctx, owner) // a call starts the store's schema check again
			}
		}
		if behind == 0 || ctx.Err() != nil || time.Now().After(deadline) {
			return behind, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}
