//go:build !purego

package fingerprint

import "golang.org/x/sys/cpu"

// passContent passes over string content from data[i], 32 bytes at a time
// where the processor has AVX2 (content_amd64.s), writing it to buf[o:] as
// it reads it, and returns where it stopped in both, whether a byte >=
// 0x80 was passed and whether an escape was. It stops at a byte that
// attention marks, except at an escape whose second byte kept marks, which
// it passes over as it is, and at a \u escape of a character that is
// neither a control character, a quote, a backslash nor a surrogate, which
// it decodes; and where fewer than 32 bytes of data or of buf are left.
// Without AVX2 it passes over nothing, and scanString goes on eight bytes
// at a time.
func passContent(data []byte, i int, buf []byte, o int, kept *[256]bool) (int, int, bool, bool) {
	if !hasAVX2 {
		return i, o, false, false
	}
	return passContentAVX2(data, i, buf, o, kept)
}

// hasAVX2 is whether passContent runs passContentAVX2 (tests turn it off).
var hasAVX2 = cpu.X86.HasAVX2

//go:noescape
func passContentAVX2(data []byte, i int, buf []byte, o int, kept *[256]bool) (ni, no int, high, escaped bool)
