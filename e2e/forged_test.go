//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// forwardHeader is the request header a replica hands a turn over with.
const forwardHeader = "Contproxy-Forward"

// forwardValue returns a Contproxy-Forward value for body as a replica
// signs it with secret at time at: the turn continues response prev on
// the socket numbered socket.
func forwardValue(secret string, at time.Time, socket uint64, prev string, body []byte) string {
	sum := sha256.Sum256(body)
	m := hmac.New(sha256.New, []byte(secret))
	by := time.Now().Add(2 * time.Second).UnixMilli() // the acceptance deadline
	fmt.Fprintf(m, "contproxy-forward-v3\n%d\n%d\n%d\n%s\n%x", at.Unix(), by, socket, prev, sum)
	return fmt.Sprintf("t=%d, by=%d, socket=%d, prev=%s, sig=%s", at.Unix(), by, socket, prev, hex.EncodeToString(m.Sum(nil)))
}

// TestForgedForward sends turns with forged Contproxy-Forward headers
// straight to a replica with forwarding on: signed with another secret,
// signed for another body, and validly signed but older than a replica
// accepts (a replayed header). Each must be answered 403 forward_refused
// while the fake upstream receives nothing, not even a connection. A
// validly signed, fresh header for a socket the replica does not hold is
// refused too, but for that (409): the signatures are checked as the
// replicas make them. Last, a plain turn reaches the upstream, which shows
// that the upstream's log would have shown a connection.
func TestForgedForward(t *testing.T) {
	addr := redisAddr(t)
	st := startStack(t, "F-forged-forward", stackConfig{
		transport: "ws", replicas: 1, redis: addr, toolCalls: toolCalls, forward: true,
	})
	target := st.replicas[0].base + "/v1/responses"
	body := []byte(`{"model":"gpt-5.1","stream":true,"store":false,` +
		`"input":[{"type":"message","role":"user","content":"What directory am I in?"}]}`)
	other := bytes.Replace(body, []byte("What directory"), []byte("Which directory"), 1)
	wrongSecret := strings.Repeat("not the replicas' secret ", 2)
	now := time.Now()
	const prev = "resp_forged"
	ctx, cancel := context.WithTimeout(t.Context(), 2*clientTimeout)
	defer cancel()
	before, err := st.counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, header string
		status       int
		code, says   string
	}{
		{"wrong signature", forwardValue(wrongSecret, now, 1, prev, body), http.StatusForbidden, "forward_refused", "signature"},
		{"signed for another body", forwardValue(st.forwardSecret, now, 1, prev, other), http.StatusForbidden, "forward_refused", "signature"},
		{"stale", forwardValue(st.forwardSecret, now.Add(-10*time.Minute), 1, prev, body), http.StatusForbidden, "forward_refused", "stale"},
		{"valid, no such socket", forwardValue(st.forwardSecret, now, 1, prev, body), http.StatusConflict, "forward_refused", ""},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "-"), func(t *testing.T) {
			// A forwarded body ends with the go (its last byte), sent
			// here at once: a forger would.
			status, msg, code, err := post(ctx, target, append(slices.Clip(body), 'g'), http.Header{forwardHeader: {tc.header}})
			if err != nil {
				t.Fatal(err)
			}
			if status != tc.status || code != tc.code || !strings.Contains(msg, tc.says) {
				t.Errorf("answered %d %s %q, want %d %s saying %q", status, code, msg, tc.status, tc.code, tc.says)
			}
			if n, err := st.up.requests(); err != nil || n != 0 {
				t.Errorf("the fake upstream received %d requests (%v), want none", n, err)
			}
			if calls, err := readTrace(st.up.trace); err != nil || len(calls) != 0 {
				t.Errorf("the fake upstream answered %d calls (%v), want none", len(calls), err)
			}
		})
	}
	after, err := st.counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := after.sub(before); d.turns != 0 || d.itemsSent != 0 || d.forwardedIn != 0 || d.continued != 0 {
		t.Errorf("contproxy counts %d turns, %d items sent upstream, %d turns carried for another replica, %d continued; "+
			"want 0 of each (a turn the replica refused is not carried, even validly signed)", d.turns, d.itemsSent, d.forwardedIn, d.continued)
	}
	if status, msg, _, err := post(ctx, target, body, nil); err != nil || status != http.StatusOK {
		t.Fatalf("a plain turn: %d %q (%v), want 200", status, msg, err)
	}
	if n, err := st.up.requests(); err != nil || n == 0 {
		t.Errorf("after a plain turn the fake upstream logged %d requests (%v), want its connection", n, err)
	}
}

// post sends body to url with header and returns the status and, for an
// error, its message and code; an answer is read to its end.
func post(ctx context.Context, url string, body []byte, header http.Header) (status int, msg, code string, err error) {
	ctx, cancel := context.WithTimeout(ctx, goRequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer fake-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, "", "", err
	}
	if resp.StatusCode/100 == 2 {
		return resp.StatusCode, "", "", nil
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		return resp.StatusCode, string(raw), "", nil
	}
	return resp.StatusCode, e.Error.Message, e.Error.Code, nil
}
