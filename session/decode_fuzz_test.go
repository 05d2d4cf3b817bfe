package session

import (
	"strings"
	"testing"
)

func FuzzDecodeHead(f *testing.F) {
	f.Add("3\x00{\"id\":\"s\",\"messages\":[]}\x00\x00\x00")
	f.Add("2\x00\x00{\"id\":\"s\"}\x002\x00{\"a\":1}\x01[2]")
	f.Add("1\x00\x00{\"id\":\"s\"}\x005\x00")
	f.Fuzz(func(t *testing.T, s string) {
		// Five parts separated by NUL: version, snapshot, header, count,
		// and the journal's messages separated by \x01. An empty part is nil.
		parts := strings.SplitN(s, "\x00", 5)
		reply := make([]any, len(parts))
		for i, p := range parts {
			switch {
			case i == 4:
				var log []any
				for _, m := range strings.Split(p, "\x01") {
					if m != "" {
						log = append(log, m)
					}
				}
				reply[i] = log
			case p != "":
				reply[i] = p
			}
		}
		got, err := decodeHead("s", reply)
		if err != nil {
			return
		}
		if got.ID != "s" || got.Version == 0 {
			t.Fatalf("decoded %+v from %q", got, s)
		}
	})
}
