package store

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/contstore/contstore/fingerprint"
)

// fuzzReply builds a script reply from text: elements separated by "|",
// "~" for nil, "#n" for the integer n, "[a,b]" for a nested array of
// strings, anything else a bulk string. It lets the fuzzer reach every
// shape a broken or hostile server could answer.
func fuzzReply(s string) []any {
	var out []any
	for _, part := range strings.Split(s, "|") {
		switch {
		case part == "~":
			out = append(out, nil)
		case strings.HasPrefix(part, "#"):
			n, err := strconv.ParseInt(part[1:], 10, 64)
			if err != nil {
				out = append(out, part)
				continue
			}
			out = append(out, n)
		case strings.HasPrefix(part, "[") && strings.HasSuffix(part, "]"):
			var inner []any
			for _, e := range strings.Split(part[1:len(part)-1], ",") {
				inner = append(inner, e)
			}
			out = append(out, inner)
		default:
			out = append(out, part)
		}
	}
	return out
}

func FuzzDecodeReserve(f *testing.F) {
	f.Add("17:1:0:" + string(appendContinuation(nil, continuation{ResponseID: "resp_1", Origin: Socket{Replica: "replica", ID: 3}})))
	f.Add("17:0:0")
	f.Add("17:1:2:")
	f.Add("x:1:0:resp")
	f.Add("-5:1:0")
	f.Add("17:2:0")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := decodeReserve(s, nil)
		if err != nil {
			return
		}
		if got.seq == 0 || got.Evicted < 0 {
			t.Fatalf("decoded an impossible reservation %+v from %q", got, s)
		}
		if p := got.Prev; p != nil && (p.ResponseID == "" || p.Transcript.Items < 0 || p.Transcript.Bytes < 0) {
			t.Fatalf("decoded an impossible continuation %+v from %q", p, s)
		}
	})
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add("published:0")
	f.Add("stale:3")
	f.Add("gone")
	f.Add("other:-1")
	f.Add("published:-1")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := decodeRecord(s, nil)
		if err != nil {
			return
		}
		switch got.Outcome {
		case OutcomePublished, OutcomeStale, OutcomeGone:
		default:
			t.Fatalf("decoded outcome %q from %q", got.Outcome, s)
		}
		if got.Evicted < 0 {
			t.Fatalf("negative evictions from %q", s)
		}
	})
}

func FuzzDecodeInspect(f *testing.F) {
	f.Add("123456789|[t,42,r,resp,s,rep,i,1,n,2,d,3,g,4,b,5]")
	f.Add("~|[t,42]")
	f.Add("x|[t]")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		var reply []any
		if s != "" {
			reply = fuzzReply(s)
		}
		st, err := decodeInspect(reply, 4, 1)
		if err != nil {
			return
		}
		if st.Exists && st.Turn == 0 {
			t.Fatalf("existing state without a turn from %q", s)
		}
		if st.HasContinuation && (st.ResponseID == "" || st.Items < 0) {
			t.Fatalf("impossible continuation %+v from %q", st, s)
		}
	})
}

func FuzzContinuationRoundTrip(f *testing.F) {
	f.Add("resp_67cb71b351908190a308f3859487620d06981a8637e6bc44", "gw-a", uint64(7), 2, int64(118), uint64(1), uint64(2))
	f.Add("resp_68A1F0C2", "", uint64(0), 0, int64(0), uint64(0), uint64(0))
	f.Add("resp_", "r", uint64(1), 1, int64(1), uint64(1), uint64(1))
	f.Add("resp_0", "r", uint64(1), 1, int64(1), uint64(1), uint64(1))
	f.Fuzz(func(t *testing.T, id, replica string, sock uint64, items int, bytes int64, digest, signature uint64) {
		if id == "" || items < 0 || bytes < 0 || items > 1<<62 || bytes > 1<<62 {
			return
		}
		c := continuation{ResponseID: id, Origin: Socket{Replica: replica, ID: sock}, Signature: signature,
			Transcript: fingerprint.Transcript{Items: items, Bytes: bytes, Digest: digest}}
		if sock == 0 {
			c.Origin = Socket{Any: true}
		}
		back, err := decodeContinuation(encodeContinuation(c))
		c.Origin.Replica = replicaRef(c.Origin.Replica) // the state keeps the replica's digest
		if sock == 0 {
			c.Origin = Socket{Any: true}
		}
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("%+v came back as %+v, %v", c, back, err)
		}
	})
}
