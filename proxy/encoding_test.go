package proxy

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"io"
	"math/bits"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// encode returns b compressed with codings, a Content-Encoding value
// (applied in its order); b itself when it names none.
func encode(t testing.TB, b []byte, codings string) []byte {
	t.Helper()
	for c := range strings.SplitSeq(codings, ",") {
		var buf bytes.Buffer
		var w io.WriteCloser
		switch c = strings.ToLower(strings.TrimSpace(c)); c {
		case "", "identity":
			continue
		case "gzip":
			w = gzip.NewWriter(&buf)
		case "deflate":
			w = zlib.NewWriter(&buf)
		case "br":
			w = brotli.NewWriter(&buf)
		case "zstd":
			z, err := zstd.NewWriter(&buf)
			require.NoError(t, err)
			w = z
		default:
			t.Fatalf("no coding %q here", c)
		}
		_, err := w.Write(b)
		require.NoError(t, err)
		require.NoError(t, w.Close())
		b = buf.Bytes()
	}
	return b
}

// Codex, signed in with ChatGPT, compresses its turns with zstd: turns in
// any coding HTTP defines for bodies, or several, continue as others do,
// and go upstream decoded (the fake upstream reads only JSON).
func TestCompressedTurnsContinue(t *testing.T) {
	for _, coding := range []string{"gzip", "deflate", "br", "zstd", "ZSTD", "gzip, zstd", "identity"} {
		t.Run(coding, func(t *testing.T) {
			r := newRig(t, overHTTP, nil)
			c := newConversation(t, r.url, "s1", true, true)
			c.header.Set("Content-Encoding", coding)
			c.say("hello")
			c.say("again")
			st := r.proxy.Stats()
			assert.Equal(t, int64(6), st.Turns)
			assert.Equal(t, st.Turns-1, st.Continued, "every turn after the first continues")
		})
	}
}

// A turn whose body has a coding the proxy does not decode goes upstream
// as the client sent it, outside the store, as the API's other endpoints
// do; a body that does not decode is refused, and a body past
// MaxBodyBytes once decoded gets 413.
func TestCompressedTurnsTheProxyCannotRead(t *testing.T) {
	var got struct {
		coding string
		body   []byte
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.coding = r.Header.Get("Content-Encoding")
		got.body, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed","output":[]}`)
	}))
	t.Cleanup(upstream.Close)
	p := newProxy(t, overHTTP, nil, upstream.URL+"/v1")
	p.cfg.MaxBodyBytes = 1 << 20
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	send := func(coding string, body []byte) (int, string) {
		return postCoded(t, srv.URL+"/v1/responses", coding, body)
	}
	turn := []byte(`{"model":"m","input":[{"role":"user","content":"hi"}]}`)

	status, _ := send("compress", []byte("not something this proxy reads"))
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "compress", got.coding)
	assert.Equal(t, "not something this proxy reads", string(got.body), "sent as received")
	assert.Zero(t, p.Stats().Turns, "outside the store")
	thrice := encode(t, turn, "gzip, gzip, gzip")
	status, _ = send("gzip, gzip, gzip", thrice)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "gzip, gzip, gzip", got.coding, "more codings than the proxy decodes: sent as received")
	assert.Equal(t, thrice, got.body)
	assert.Equal(t, int64(2), p.Stats().Unread)

	status, _ = send("gzip", encode(t, turn, "gzip"))
	assert.Equal(t, http.StatusOK, status)
	assert.Empty(t, got.coding, "sent decoded")
	assert.JSONEq(t, string(turn), string(got.body))

	status, body := send("zstd", []byte("not zstd"))
	assert.Equal(t, http.StatusBadRequest, status, body)
	assert.Contains(t, body, "zstd")

	bomb, err := json.Marshal(map[string]any{"model": "m", "input": strings.Repeat("x", 8<<20)})
	require.NoError(t, err)
	for _, coding := range []string{"gzip", "zstd", "br"} {
		small := encode(t, bomb, coding)
		require.Less(t, len(small), 64<<10)
		status, body = send(coding, small)
		assert.Equal(t, http.StatusRequestEntityTooLarge, status, "%s: %.200s", coding, body)
	}
}

// A zstd body holds its decoder's window, twice, in the budget while it
// decodes: a window the budget cannot hold is refused (413), a small one
// is served.
func TestAZstdBodyHoldsItsWindow(t *testing.T) {
	r := newBudgetRig(t, func(c *Config) { c.MaxBytesInFlight = 4 << 20 })
	turn := []byte(`{"model":"m","input":[{"role":"user","content":"hi"}]}`)
	for _, tc := range []struct {
		window int
		status int
	}{{8 << 20, http.StatusRequestEntityTooLarge}, {64 << 10, http.StatusOK}} {
		// A frame written by hand, as an encoder streaming a body of
		// unknown length writes it: its window declared (RFC 8878
		// 3.1.1.1.2), no content size, one raw block.
		frame := append([]byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, byte(bits.Len(uint(tc.window))-1-10) << 3}, rawBlock(turn)...)
		var h zstd.Header
		require.NoError(t, h.Decode(frame))
		require.Equal(t, uint64(tc.window), h.WindowSize)
		status, b := postCoded(t, r.url, "zstd", frame)
		assert.Equal(t, tc.status, status, "window %d: %s", tc.window, b)
	}
	assert.True(t, budgetFree(r.proxy), "the budget is free once the bodies are done")

	// A first frame of one small segment, then one declaring an 8 MiB
	// window: refused, not decoded with a window the budget did not hold.
	first, second := turn[:13], turn[13:]
	body := append([]byte{0x28, 0xb5, 0x2f, 0xfd, 0x20, byte(len(first))}, rawBlock(first)...)
	body = append(append(body, 0x28, 0xb5, 0x2f, 0xfd, 0x00, byte(23-10)<<3), rawBlock(second)...)
	req, err := http.NewRequest(http.MethodPost, r.url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Encoding", "zstd")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "window")
}

// A brotli body holds its ring buffer, as large as the window its header
// declares, in the budget while it decodes.
func TestABrotliBodyHoldsItsWindow(t *testing.T) {
	for _, tc := range []struct {
		head byte
		want int64
	}{{0x00, 1 << 16}, {0x01, 1 << 17}, {0x0b, 1 << 22}, {0x0f, 1 << 24}, {0x21, 1 << 10}, {0x71, 1 << 15}, {0x11, 1 << 24}} {
		assert.Equal(t, tc.want, brotliWindow([]byte{tc.head}), "%#x", tc.head)
	}

	r := newBudgetRig(t, func(c *Config) { c.MaxBytesInFlight = 4 << 20 })
	turn := []byte(`{"model":"m","input":[{"role":"user","content":"hi"}]}`)
	for _, tc := range []struct {
		lgwin  int
		status int
	}{{24, http.StatusRequestEntityTooLarge}, {16, http.StatusOK}} {
		var buf bytes.Buffer
		w := brotli.NewWriterOptions(&buf, brotli.WriterOptions{Quality: 5, LGWin: tc.lgwin})
		_, err := w.Write(turn)
		require.NoError(t, err)
		require.NoError(t, w.Close())
		require.Equal(t, int64(1)<<tc.lgwin, brotliWindow(buf.Bytes()), "the window the header declares")
		status, b := postCoded(t, r.url, "br", buf.Bytes())
		assert.Equal(t, tc.status, status, "window 2^%d: %s", tc.lgwin, b)
	}
	assert.True(t, budgetFree(r.proxy), "the budget is free once the bodies are done")
}

// postCoded posts body to url in Content-Encoding coding and returns the
// answer's status and body.
func postCoded(t *testing.T, url, coding string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", coding)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// rawBlock is a zstd frame's last block, raw, holding b.
func rawBlock(b []byte) []byte {
	h := 1 | len(b)<<3
	return append([]byte{byte(h), byte(h >> 8), byte(h >> 16)}, b...)
}
