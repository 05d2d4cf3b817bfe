package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/store"
)

// BenchmarkForwardHop measures a streamed WebSocket turn (store=false)
// through two replicas: "local" lands every later turn on the replica
// holding its socket, "forwarded" on the other one, which hands it over.
// The difference is the cost of the hop; p50 and p99 per turn are
// reported. Conversations restart every 16 turns so that bodies stay small.
func BenchmarkForwardHop(b *testing.B) {
	for _, mode := range []string{"local", "forwarded"} {
		b.Run(mode, func(b *testing.B) {
			rs := newReplicaSet(b, 2)
			target := rs.servers[0].URL + "/v1/responses"
			if mode == "forwarded" {
				target = rs.servers[1].URL + "/v1/responses"
			}
			var c *conversation
			lat := make([]time.Duration, 0, b.N)
			for i := range b.N {
				if i%16 == 0 {
					b.StopTimer()
					c = newConversation(b, rs.servers[0].URL+"/v1/responses", fmt.Sprint("bench-", i), true, false)
					delete(c.params, "tools") // no tool loop: one request a user turn
					c.say("hello")            // on r1, which then holds the socket
					c.url = target
					b.StartTimer()
				}
				start := time.Now()
				c.say("again")
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			s := rs.total()
			if s.Continued != int64(b.N) {
				b.Fatalf("%d of %d timed turns continued", s.Continued, b.N)
			}
			if want := map[string]int64{"local": 0, "forwarded": int64(b.N)}[mode]; s.Forwarded != want {
				b.Fatalf("%d turns forwarded, want %d", s.Forwarded, want)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkReadRequest measures what the proxy does with a 1 MB request
// body before anything goes upstream, its owner included: "one pass" is
// the proxy's code (the fingerprint scanner, every member read from its
// pass); "three parsers" is the same work as the proxy did it before, a
// map decode of the body, the scanner, and gjson over the body for the
// identity sources, kept here as the baseline of the ratio.
func BenchmarkReadRequest(b *testing.B) {
	st, err := store.NewMemory(store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	body := megabyteBody()
	h := http.Header{"Authorization": {"Bearer sk-test"}}
	id := DefaultIdentity
	b.Run("one pass", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			req, err := st.ParseRequest(body)
			if err != nil {
				b.Fatal(err)
			}
			_ = rawMember(req, "stream") == "true" && rawMember(req, "store") != "false" && passthrough(req)
			if _, err := id.Owner(h, "", req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("three parsers", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var top map[string]json.RawMessage
			if err := json.Unmarshal(body, &top); err != nil {
				b.Fatal(err)
			}
			req, err := st.ParseRequest(body)
			if err != nil {
				b.Fatal(err)
			}
			for _, s := range id.Session {
				if s.Field != "" {
					_ = gjson.GetBytes(body, escapePath(s.Field))
				}
			}
			if _, err := id.Owner(h, "", req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// megabyteBody is a request of about 1 MB: a prompt with tools and 400
// messages and function calls of about 2.5 kB each.
func megabyteBody() []byte {
	items := []any{map[string]any{"role": "user", "content": "start"}}
	text := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 55)
	for i := range 200 {
		items = append(items,
			map[string]any{"type": "function_call", "call_id": fmt.Sprint("call_", i), "name": "run", "arguments": `{"command":"ls -la"}`},
			map[string]any{"type": "function_call_output", "call_id": fmt.Sprint("call_", i), "output": text + text})
	}
	b, err := json.Marshal(map[string]any{"model": "gpt-5.1", "stream": true, "store": false,
		"instructions": "Be terse.", "input": items,
		"tools": []any{map[string]any{"type": "function", "name": "run", "parameters": map[string]any{"type": "object"}}}})
	if err != nil {
		panic(err)
	}
	return b
}
