package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/store"
)

// With Affinity, a record that runs on a goroutine of its own is in flight
// under its owner from the moment record returns, before the handler
// writes the end: the owner's next turn, sent the moment the end arrives,
// reserves after it (Proxy.reserve).
func TestARecordIsInFlightOnceStarted(t *testing.T) {
	r, held, _ := newHeldRig(t, lua.Record, store.Options{Namespace: "inflight"}, true)
	st := r.proxy.cfg.Store
	up, ok := r.proxy.cfg.Upstream.(*httpUpstream)
	require.True(t, ok)
	owner, err := identity.Main("s-inflight")
	require.NoError(t, err)
	req, err := st.ParseRequest([]byte(`{"model":"m","input":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	ctx := context.Background()
	res := st.Reserve(ctx, owner, req)
	require.NotZero(t, res.Turn)

	a := &sent{c: &httpConn{up: up, tg: &target{stores: true}}, res: res}
	rec := r.proxy.record(ctx, r.proxy.cfg.Logger, &hold{}, a, outcome{status: 200, completed: true, id: "resp_1"})
	done := r.proxy.records.pending(owner)
	require.NotNil(t, done, "the record is in flight once record returned")
	select {
	case <-done:
		t.Fatal("the record ended while its call was held")
	default:
	}
	held.let(t, 0)
	rec.end(true, nil)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the record did not end once its call was let go")
	}
	r.proxy.records.waitAll()
	assert.Nil(t, r.proxy.records.pending(owner))
}
