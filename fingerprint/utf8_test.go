package fingerprint

import (
	"testing"
	"unicode/utf8"
)

// utf8Len accepts exactly what the standard library decodes as one valid
// character, for every first two bytes and the tails that matter.
func TestUTF8LenMatchesTheStandardLibrary(t *testing.T) {
	for a := 0x80; a < 0x100; a++ {
		for b := 0; b < 0x100; b++ {
			for _, tail := range [][]byte{nil, {0x80}, {0xBF}, {0x80, 0x80}, {0x41}, {0xBF, 0xBF}} {
				s := append([]byte{byte(a), byte(b)}, tail...)
				for n := 1; n <= len(s); n++ {
					r, size := utf8.DecodeRune(s[:n])
					want := size
					if r == utf8.RuneError && size <= 1 {
						want = 0
					}
					if got := utf8Len(s[:n], 0); got != want {
						t.Fatalf("% x: %d, want %d", s[:n], got, want)
					}
				}
			}
		}
	}
}
