package store_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// upstream stands in for the model provider: it answers every request with
// one assistant message on socket 7.
func upstream(prev string, input []json.RawMessage) (store.Result, error) {
	return store.Result{
		ResponseID: fmt.Sprintf("resp_%d", len(input)),
		Socket:     store.Socket{ID: 7},
		Output:     []json.RawMessage{json.RawMessage(`{"type":"message","role":"assistant","content":"ok"}`)},
	}, nil
}

// A gateway's turn: reserve, forward the delta or the full context, then
// record the response or abort the turn.
func Example() {
	ctx := context.Background()
	s, err := store.NewMemory(store.Options{Replica: "gw-1"})
	if err != nil {
		panic(err)
	}
	owner, _ := identity.Main("session-42")

	bodies := []string{
		`{"model":"gpt-5","input":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-5","input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":"ok"},{"role":"user","content":"more"}]}`,
	}
	for _, body := range bodies {
		req, err := store.ParseRequest([]byte(body))
		if err != nil {
			panic(err) // a gateway answers 400 here
		}
		res := s.Reserve(ctx, owner, req)
		prev, input := "", req.Input()
		if res.Continues() && res.Origin.Replica == "gw-1" {
			prev, input = res.PreviousResponseID, res.Delta
		} else if res.Continues() {
			res = res.FullContextRetry() // the origin socket lives elsewhere
		}
		out, err := upstream(prev, input)
		if err != nil {
			_, _ = s.Abort(ctx, res)
			continue
		}
		outcome, _ := s.Record(ctx, res, req, out)
		fmt.Printf("sent %d of %d items (previous %q, reason %q): %s\n",
			len(input), req.Len(), prev, res.Reason, outcome)
	}
	// Output:
	// sent 1 of 1 items (previous "", reason "missing_state"): published
	// sent 1 of 3 items (previous "resp_1", reason ""): published
}
