package fingerprint

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/agentchat"
)

// chunks reads b in pieces of 1 to max bytes.
type chunks struct {
	b   []byte
	rng *rand.Rand
	max int
}

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.b), 1+c.rng.IntN(c.max))
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

// ReadRequest gives what Parse gives, however the body arrives: every body
// of the corpus and of the run tests, in pieces of every size, each after
// the one before it (so that the runs the arrivals match are there).
func TestReadRequestParsesAsParse(t *testing.T) {
	bodies := append(runBodies(), cacheCorpus(t)...)
	for _, profile := range []Profile{V2(), V3(), V4()} {
		plain := mustParser(profile, testKey)
		plain.items, plain.runs = nil, nil
		read := mustParser(profile, testKey)
		rng := rand.New(rand.NewPCG(1, 2))
		for i, b := range bodies {
			want, wantErr := plain.Parse(b)
			for _, max := range []int{1, 7, 300, 1 << 20} {
				got, err := read.ReadRequest(&chunks{b: b, rng: rng, max: max}, len(b))
				name := fmt.Sprintf("body %d, pieces of at most %d", i, max)
				if assertParsedAlike(t, want, wantErr, got, err, name) {
					assert.Equal(t, b, got.Body(), name)
					assert.Equal(t, want.InputSkipped(), got.InputSkipped(), name)
				}
			}
		}
	}
}

// A body whose input array begins as the previous turn's did is matched
// to that turn's run before its last bytes are in.
func TestReadRequestMatchesWhileTheBodyArrives(t *testing.T) {
	p := mustParser(V4(), testKey)
	_, err := p.Parse(agentchat.Body(100))
	require.NoError(t, err)
	prev := p.runs.order.Back().Value.(*run)
	for _, body := range [][]byte{
		agentchat.Body(102),
		// Members after the input, and one before it that may look like
		// the input (escaped) or end in a number.
		bytes.Replace(agentchat.Body(102), []byte(`"model":"gpt-5.1",`), []byte(`"inp\u0075t":1,"n":-12.5e3,"model":"gpt-5.1",`), 1),
	} {
		a := arrival{input: -1}
		input := bytes.Index(body, []byte(`"input":[`)) + len(`"input":`)
		last := input + prev.size + 1 // the byte after the run: the new items are not in
		for n := 1; n < last; n += 97 {
			a.take(p.runs, body[:n])
		}
		assert.Nil(t, a.match.found)
		a.take(p.runs, body[:last])
		assert.True(t, a.match.found == prev, "matched before the new items are in")
		assert.Equal(t, input, a.input)
	}
	// Nothing to match: no input array, or the upstream holds it.
	for _, body := range []string{
		`{"input":"a string"}`,
		`{"previous_response_id":"resp_1","input":[` + strings.Repeat(`{"role":"user","content":"x"},`, 20) + `{}]}`,
		`[]`,
	} {
		a := arrival{input: -1}
		for n := 1; n <= len(body); n++ {
			a.take(p.runs, []byte(body[:n]))
		}
		assert.True(t, a.done, body)
		assert.Equal(t, -1, a.input, body)
	}
}

// A body that ends early is io.ErrUnexpectedEOF, a read error is itself,
// and a negative size reads to the end.
func TestReadRequestErrors(t *testing.T) {
	body := []byte(`{"input":[{"role":"user","content":"hi"}]}`)
	_, err := testParser.ReadRequest(bytes.NewReader(body[:10]), len(body))
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.NotErrorIs(t, err, ErrInvalidRequest)
	boom := errors.New("boom")
	_, err = testParser.ReadRequest(iotest.ErrReader(boom), len(body))
	assert.ErrorIs(t, err, boom)
	r, err := testParser.ReadRequest(iotest.OneByteReader(bytes.NewReader(body)), -1)
	require.NoError(t, err)
	assert.Equal(t, 1, r.Len())
	_, err = testParser.ReadRequest(bytes.NewReader([]byte(`{"input":[}`)), -1)
	assert.ErrorIs(t, err, ErrInvalidRequest)
}

// A long member before the input is walked again only once the body's
// bytes have doubled since the walk last stopped in it, not at every read:
// a body read a few bytes at a time costs a few walks.
func TestArrivalWalksALongMemberAFewTimes(t *testing.T) {
	body := []byte(`{"tools":[` + strings.Repeat(`{"type":"function","name":"f"},`, 10_000) + `{}],"input":[]}`)
	p := mustParser(V4(), testKey)
	a := arrival{input: -1}
	walks, stopped := 0, 0
	for n := 1; n <= len(body); n += 64 {
		a.take(p.runs, body[:n])
		if a.stopped != stopped {
			walks++
			stopped = a.stopped
		}
	}
	assert.Less(t, walks, 30, "about log2 of the body's length")
	whole := arrival{input: -1}
	whole.take(p.runs, body)
	assert.Equal(t, bytes.LastIndexByte(body, '['), whole.input, "read at once, the walk reaches the input")
}
