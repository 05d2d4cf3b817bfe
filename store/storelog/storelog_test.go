package storelog_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storelog"
)

var ctx = context.Background()

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// buffer is a JSON log shared by concurrent writers.
type buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// errDown stands for any store failure.
var errDown = errors.New("redis down")

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines decodes the lines logged so far and forgets them.
func (b *buffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(b.buf.String()) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		delete(m, "time")
		out = append(out, m)
	}
	b.buf.Reset()
	return out
}

func newLogger(level slog.Level) (*slog.Logger, *buffer) {
	b := &buffer{}
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: level})), b
}

func owner(t *testing.T, session string) identity.Owner {
	t.Helper()
	o, err := identity.Main(session)
	require.NoError(t, err)
	return o
}

// While Redis is down, each operation's failures are logged once every
// Every, the next line counting those left out.
func TestFailuresAreRateLimitedPerOperation(t *testing.T) {
	log, buf := newLogger(slog.LevelDebug)
	clk := redistest.NewClock(t0)
	obs := storelog.New(log, storelog.Options{Now: clk.Now, Debug: true})
	client := redistest.Failing(t)
	s, err := store.NewRedis(client, store.Options{Observer: obs, BreakerFailures: -1, OpTimeout: time.Second})
	require.NoError(t, err)
	o := owner(t, "s1")

	for range 5 {
		require.Equal(t, store.ReasonStoreUnavailable, s.Reserve(ctx, o, nil).Reason)
	}
	_, err = s.Inspect(ctx, o)
	require.Error(t, err)
	lines := buf.lines(t)
	require.Len(t, lines, 2, "one line per operation: %v", lines)
	assert.Equal(t, "WARN", lines[0]["level"])
	assert.Equal(t, storelog.MsgFailOpen, lines[0]["msg"])
	assert.Equal(t, "reserve", lines[0]["op"])
	assert.Equal(t, "store_unavailable", lines[0]["reason"])
	assert.Equal(t, "s1", lines[0]["session"])
	assert.NotContains(t, lines[0], "agent")
	assert.Contains(t, lines[0]["error"], "redis down")
	assert.Equal(t, 0.0, lines[0]["suppressed"])
	assert.Contains(t, lines[0], "latency")
	assert.Equal(t, "WARN", lines[1]["level"])
	assert.Equal(t, storelog.MsgFailed, lines[1]["msg"])
	assert.Equal(t, "inspect", lines[1]["op"])
	assert.Equal(t, 0.0, lines[1]["suppressed"])

	clk.Add(10*time.Second - time.Millisecond)
	s.Reserve(ctx, o, nil)
	assert.Empty(t, buf.lines(t), "still within Every")
	clk.Add(time.Millisecond)
	s.Reserve(ctx, o, nil)
	lines = buf.lines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, 5.0, lines[0]["suppressed"], "four at first, one since")
}

// Successful operations are logged at Debug only with Options.Debug.
func TestSuccessesAtDebug(t *testing.T) {
	for _, c := range []struct {
		name  string
		debug bool
		level slog.Level
		want  int
	}{
		{"debug", true, slog.LevelDebug, 2},
		{"debug option off", false, slog.LevelDebug, 0},
		{"handler above debug", true, slog.LevelInfo, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			log, buf := newLogger(c.level)
			s, err := store.NewMemory(store.Options{Observer: storelog.New(log, storelog.Options{Debug: c.debug})})
			require.NoError(t, err)
			o := owner(t, "s1")
			res := s.Reserve(ctx, o, nil)
			require.NoError(t, s.Clear(ctx, o))
			lines := buf.lines(t)
			require.Len(t, lines, c.want)
			if c.want == 0 {
				return
			}
			assert.Equal(t, map[string]any{"level": "DEBUG", "msg": storelog.MsgOperation, "op": "reserve",
				"session": "s1", "reason": string(res.Reason), "latency": lines[0]["latency"]}, lines[0])
			assert.Equal(t, "clear", lines[1]["op"])
		})
	}
}

// Each partition's outage is logged when it starts and ends; the probes in
// between at most once every Every.
func TestBreakerChanges(t *testing.T) {
	log, buf := newLogger(slog.LevelInfo)
	clk := redistest.NewClock(t0)
	obs := storelog.New(log, storelog.Options{Now: clk.Now})
	change := func(after time.Duration, p int, s store.BreakerState, opens int64) {
		clk.Set(t0.Add(after))
		obs.BreakerChanged(store.BreakerStatus{Partition: p, State: s, Opens: opens, Since: clk.Now(), ConsecutiveFailures: 5})
	}
	type line struct {
		level, msg string
		partition  float64
		suppressed float64
	}
	check := func(want ...line) {
		t.Helper()
		got := buf.lines(t)
		require.Len(t, got, len(want), "%v", got)
		for i, w := range want {
			assert.Equal(t, w.level, got[i]["level"], "line %d", i)
			assert.Equal(t, w.msg, got[i]["msg"], "line %d", i)
			assert.Equal(t, w.partition, got[i]["partition"], "line %d", i)
			assert.Equal(t, w.suppressed, got[i]["suppressed"], "line %d", i)
		}
	}

	change(0, 0, store.BreakerOpen, 1)
	check(line{"WARN", storelog.MsgBreakerOpen, 0, 0})
	change(time.Second, 0, store.BreakerHalfOpen, 1)
	change(time.Second, 0, store.BreakerOpen, 2)
	check()
	change(2*time.Second, 1, store.BreakerOpen, 1)
	check(line{"WARN", storelog.MsgBreakerOpen, 1, 0})
	change(11*time.Second, 0, store.BreakerHalfOpen, 2)
	check(line{"INFO", storelog.MsgBreakerProbe, 0, 2})
	change(12*time.Second, 0, store.BreakerClosed, 2)
	got := buf.lines(t)
	require.Len(t, got, 1)
	assert.Equal(t, map[string]any{"level": "INFO", "msg": storelog.MsgBreakerClosed, "partition": 0.0,
		"state": "closed", "consecutive_failures": 5.0, "opens": 2.0, "open_for": float64(12 * time.Second),
		"suppressed": 0.0}, got[0])
	change(13*time.Second, 0, store.BreakerOpen, 3)
	check(line{"WARN", storelog.MsgBreakerOpen, 0, 0})
}

// A negative Every logs every failure.
func TestNegativeEveryLogsEverything(t *testing.T) {
	log, buf := newLogger(slog.LevelInfo)
	obs := storelog.New(log, storelog.Options{Every: -1})
	agent, err := identity.Agent("s1", "a1")
	require.NoError(t, err)
	for range 3 {
		obs.Observe(store.Event{Op: store.OpRecord, Owner: agent, Err: errDown})
	}
	lines := buf.lines(t)
	require.Len(t, lines, 3)
	assert.Equal(t, map[string]any{"level": "WARN", "msg": storelog.MsgFailed, "op": "record",
		"session": "s1", "agent": "a1", "latency": 0.0, "error": "redis down", "suppressed": 0.0}, lines[2])
}

// Under concurrent use no failure is lost: every one is logged or counted
// as suppressed by a later line.
func TestConcurrentFailuresAreAllAccountedFor(t *testing.T) {
	log, buf := newLogger(slog.LevelInfo)
	clk := redistest.NewClock(t0)
	obs := storelog.New(log, storelog.Options{Now: clk.Now, Every: time.Second})
	var wg sync.WaitGroup
	const goroutines, each = 8, 300
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				obs.Observe(store.Event{Op: store.OpRecord, Err: errDown})
				obs.BreakerChanged(store.BreakerStatus{Partition: g % 2, State: store.BreakerOpen, Opens: int64(i)})
				if i%50 == 0 {
					clk.Add(300 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	clk.Add(time.Hour)
	obs.Observe(store.Event{Op: store.OpRecord, Err: errDown})
	var accounted float64
	for _, l := range buf.lines(t) {
		if l["op"] == "record" {
			accounted += 1 + l["suppressed"].(float64)
		}
	}
	assert.Equal(t, float64(goroutines*each+1), accounted)
}

func TestNilLoggerUsesDefault(t *testing.T) {
	var b bytes.Buffer
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&b, nil)))
	storelog.New(nil, storelog.Options{}).Observe(store.Event{Op: store.OpClear, Err: errDown})
	assert.Contains(t, b.String(), fmt.Sprintf("msg=%q", storelog.MsgFailed))
}
