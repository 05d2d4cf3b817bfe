package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/contstore/contstore/store"
)

// BenchmarkBodiesInFlight sends six 31 MB bodies of 1 M small items each
// (the heaviest a byte of body gets in the parse) at once through the
// proxy, in front of an upstream that reads each body and answers after
// 500 ms, and reports the peak heap in use (sampled every millisecond)
// and the peak RSS of the process (VmHWM, reset first), each also above
// the process before the round. The clients retry a 503 after its
// Retry-After, as the SDKs do. Budgets: none (1 TiB), the default
// (256 MiB), and 64 MiB, which refuses such a body outright.
//
//	go test -run '^$' -bench BodiesInFlight -benchtime 1x ./proxy
func BenchmarkBodiesInFlight(b *testing.B) {
	body := manyItemsBody(1_000_000)
	for _, tc := range []struct {
		name string
		size int64
	}{{"none", 1 << 40}, {"default", 0}, {"64MiB", 64 << 20}} {
		b.Run(tc.name, func(b *testing.B) {
			url := discardingProxy(b, tc.size)
			for i := 0; b.Loop(); i++ {
				var statuses map[int]int
				m := peakMemory(b, func() { statuses = sendAtOnce(b, url, fmt.Sprint(tc.name, i), body, 6) })
				for _, f := range []struct {
					name string
					p    peak
				}{{"heap", m.heap}, {"live", m.live}, {"rss", m.rss}} {
					b.ReportMetric(float64(f.p.peak)/(1<<20), "peak-"+f.name+"-MiB")
					b.ReportMetric(float64(f.p.peak-f.p.base)/(1<<20), f.name+"-above-MiB")
				}
				b.ReportMetric(float64(statuses[http.StatusOK]), "served")
				b.ReportMetric(float64(statuses[http.StatusServiceUnavailable]), "503s")
				b.ReportMetric(float64(statuses[http.StatusRequestEntityTooLarge]), "413s")
			}
		})
	}
}

// manyItemsBody is a turn of n user messages of 30 bytes each.
func manyItemsBody(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"gpt-test","stream":false,"store":false,"input":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"role":"user","content":"%02d"}`, i%100)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// discardingProxy serves a proxy with a budget of size in front of an
// upstream that reads each body to its end and answers a completed
// response after 500 ms; it returns the proxy's /v1/responses.
func discardingProxy(b *testing.B, size int64) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(500 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed","output":[]}`)
	}))
	b.Cleanup(up.Close)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	if err != nil {
		b.Fatal(err)
	}
	hu, err := NewHTTPUpstream(up.URL+"/v1", nil)
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Config{Store: st, Upstream: hu, MaxBytesInFlight: size})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(p)
	b.Cleanup(srv.Close)
	return srv.URL + "/v1/responses"
}

// sendAtOnce sends body n times at once, each as its own session, and
// retries a 503 after its Retry-After for up to two minutes; it returns
// how many answers had each status, refusals included.
func sendAtOnce(b *testing.B, url, session string, body []byte, n int) map[int]int {
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			deadline := time.Now().Add(2 * time.Minute)
			for {
				req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("X-Session-Id", fmt.Sprint(session, "-", i))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				statuses[resp.StatusCode]++
				mu.Unlock()
				wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
				if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
					return
				}
				time.Sleep(time.Duration(wait) * time.Second)
			}
		})
	}
	wg.Wait()
	return statuses
}

// peak is a figure before a round and its peak during the round.
type peak struct{ base, peak uint64 }

// memoryPeaks are the peaks of a round: the heap in use (HeapInuse), the
// live heap as of the last collection (/gc/heap/live:bytes), both sampled
// every millisecond, and the process's RSS.
type memoryPeaks struct{ heap, live, rss peak }

// peakMemory runs f and returns the memory's peaks while it ran.
func peakMemory(b *testing.B, f func()) memoryPeaks {
	runtime.GC()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Skip("cannot reset the peak RSS:", err)
	}
	var m memoryPeaks
	sample := func() (inUse, live uint64) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return ms.HeapInuse, s[0].Value.Uint64()
	}
	m.heap.base, m.live.base = sample()
	m.heap.peak, m.live.peak = m.heap.base, m.live.base
	m.rss.base = procStatus(b, "VmRSS")
	done, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			inUse, live := sample()
			m.heap.peak, m.live.peak = max(m.heap.peak, inUse), max(m.live.peak, live)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	f()
	close(done)
	<-sampled
	m.rss.peak = procStatus(b, "VmHWM")
	return m
}

// procStatus returns a field of /proc/self/status, in bytes.
func procStatus(b *testing.B, field string) uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Skip(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}
