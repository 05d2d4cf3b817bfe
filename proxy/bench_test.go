package proxy

import (
	"fmt"
	"slices"
	"testing"
	"time"
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
