//go:build !purego

package fingerprint

import "testing"

// scanPaths runs f as the processor allows strings to be scanned and,
// where that is with AVX2, as without it.
func scanPaths(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	f(t)
	if hasAVX2 {
		hasAVX2 = false
		defer func() { hasAVX2 = true }()
		f(t)
	}
}
