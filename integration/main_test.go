package integration

import (
	"flag"
	"os"
	"testing"
)

// TestMain bounds the property tests' run time on real servers, where every
// step is a round trip: 25 random histories per test unless -rapid.checks
// says otherwise.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue {
		_ = f.Value.Set("25")
	}
	os.Exit(m.Run())
}
