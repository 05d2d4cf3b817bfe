//go:build !amd64 || purego

package fingerprint

import "testing"

// scanPaths runs f: strings are scanned one way here.
func scanPaths(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	f(t)
}
