package store

import (
	"strconv"
	"strings"
	"testing"
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
	f.Add("17|#1|#0|resp_1|replica|3|2|-5|9|120")
	f.Add("17|#0|#0")
	f.Add("17|#1|#2|~|~|~|~|~|~|~")
	f.Add("x|#1|#0|resp|r|-1|a|b|c|d")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := decodeReserve(fuzzReply(s))
		if err != nil {
			return
		}
		if got.Turn == 0 || got.Evicted < 0 {
			t.Fatalf("decoded an impossible reservation %+v from %q", got, s)
		}
		if p := got.Prev; p != nil && (p.ResponseID == "" || p.Transcript.Items < 0 || p.Transcript.Bytes < 0) {
			t.Fatalf("decoded an impossible continuation %+v from %q", p, s)
		}
	})
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add("published|#0")
	f.Add("stale|#3")
	f.Add("gone")
	f.Add("other|#-1")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := decodeRecord(fuzzReply(s))
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
