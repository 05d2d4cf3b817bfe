package store_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// answer is what callUpstream returns: the response's id and output items.
type answer struct {
	ID     string
	Output []json.RawMessage
}

// callUpstream stands in for the model provider, which stores responses
// (store=true over HTTP, so any connection can continue them): it answers
// every request with one assistant message and says what it received.
func callUpstream(body []byte) (answer, error) {
	var req struct {
		Previous string            `json:"previous_response_id"`
		Input    []json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return answer{}, err
	}
	fmt.Printf("upstream got %d items, previous_response_id %q\n", len(req.Input), req.Previous)
	return answer{
		ID:     fmt.Sprintf("resp_%d", len(req.Input)),
		Output: []json.RawMessage{json.RawMessage(`{"type":"message","role":"assistant","content":"ok"}`)},
	}, nil
}

// turn is one request of a gateway, as the README shows it.
func turn(ctx context.Context, s *store.Store, owner identity.Owner, body []byte) string {
	req, err := s.ParseRequest(body)
	if err != nil {
		return "400 " + err.Error()
	}
	res := s.Reserve(ctx, owner, req)
	why := res.Reason // why this turn is not continued; "" when it is
	if res.Continues() && !res.Local() {
		res = res.FullContextRetry() // or forward the turn to res.Origin.Replica
	}
	out, err := callUpstream(res.UpstreamBody())
	ctx = context.WithoutCancel(ctx) // record even if the client hung up
	if err != nil {
		// Sent again, the request continues from the same response; a turn
		// that took no such continuation aborts.
		if o, _ := s.Restore(ctx, res); o == store.OutcomeIgnored {
			_, _ = s.Abort(ctx, res)
		}
		return "502 " + err.Error()
	}
	outcome, err := s.Record(ctx, res, store.Result{ResponseID: out.ID, Socket: store.Socket{Any: true}, Output: out.Output})
	if err != nil {
		return "recording failed, the next turn sends full context: " + err.Error()
	}
	return fmt.Sprintf("sent %d of %d items, reason %q: %s", res.UpstreamItems, req.Len(), why, outcome)
}

// A gateway's turns: the second appends to the first and continues it, the
// third changes the instructions and sends the full context.
func Example() {
	ctx := context.Background()
	s, err := store.NewMemory(store.Options{Replica: "gw-1"})
	if err != nil {
		panic(err)
	}
	owner, _ := identity.Main("session-42")
	for _, body := range []string{
		`{"model":"gpt-5","input":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-5","input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":"ok"},{"role":"user","content":"more"}]}`,
		`{"model":"gpt-5","instructions":"Be brief.","input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":"ok"},{"role":"user","content":"more"},{"type":"message","role":"assistant","content":"ok"},{"role":"user","content":"again"}]}`,
	} {
		fmt.Println(turn(ctx, s, owner, []byte(body)))
	}
	// Output:
	// upstream got 1 items, previous_response_id ""
	// sent 1 of 1 items, reason "missing_state": published
	// upstream got 1 items, previous_response_id "resp_1"
	// sent 1 of 3 items, reason "": published
	// upstream got 5 items, previous_response_id ""
	// sent 5 of 5 items, reason "prompt_changed": published
}
