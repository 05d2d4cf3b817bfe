package proxy

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A cause logs at most a line a second, counting what it left out; other
// causes are logged apart.
func TestWarningsLogALineASecondPerCause(t *testing.T) {
	var out bytes.Buffer
	lg := slog.New(slog.NewTextHandler(&out, nil))
	now := time.Unix(1_800_000_000, 0)
	w := &warnings{now: func() time.Time { return now }}
	for range 25 { // 2.5 s of a warning every 100 ms
		w.warn(lg, "store unavailable", "err", "down")
		w.warn(lg, "directory lookup failed", "err", "down")
		now = now.Add(100 * time.Millisecond)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	assert.Len(t, lines, 6, "3 lines per cause in 2.5 s:\n%s", out.String())
	assert.Contains(t, lines[0], "suppressed=0")
	assert.Contains(t, lines[2], "suppressed=9")
	assert.Equal(t, 3, strings.Count(out.String(), `msg="directory lookup failed"`))
}
