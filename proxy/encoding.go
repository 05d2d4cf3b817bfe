package proxy

import (
	"bufio"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// A turn's body may come compressed: Codex, signed in with ChatGPT,
// sends its turns with Content-Encoding zstd. The proxy decodes the codings
// HTTP defines for bodies (gzip, deflate, br, zstd, and two of them in the
// order applied), reads the decoded body as any other, within MaxBodyBytes
// of decoded bytes, and sends it upstream uncompressed, with no
// Content-Encoding. A turn with a coding it does not know, or more than
// two, goes upstream as the client sent it, outside the store, as the
// API's other endpoints do (passthrough.go).

// maxCodings is the most codings the proxy decodes for one body: each
// takes a decoder's buffers beside the body's bytes, and clients apply
// one.
const maxCodings = 2

// bodyCodings returns the codings of a request's Content-Encoding in the
// order they were applied, without identity, and whether the proxy decodes
// every one of them: not past maxCodings.
func bodyCodings(h http.Header) ([]string, bool) {
	var codings []string
	for c := range headerList(h, "Content-Encoding") {
		switch c = strings.ToLower(c); c {
		case "identity":
		case "gzip", "x-gzip", "deflate", "br", "zstd":
			codings = append(codings, c)
		default:
			return nil, false
		}
	}
	return codings, len(codings) <= maxCodings
}

// decoder reads a body decoded from its codings, applied in their order.
// It opens its decoders at its first read, which may wait for the body's
// first bytes, so that making one reads nothing; Close frees them.
type decoder struct {
	body    io.Reader
	codings []string
	// hold, when not nil, takes what a decoder's buffers weigh beside the
	// body (zstdWindow, brotliWindow) before it decodes.
	hold  func(n int64) error
	r     io.Reader
	err   error
	frees []func()
}

func (d *decoder) Read(p []byte) (int, error) {
	if d.r == nil && d.err == nil {
		d.r, d.err = d.open()
	}
	if d.err != nil {
		return 0, d.err
	}
	n, err := d.r.Read(p)
	if err != nil && err != io.EOF {
		err = d.failed(err)
	}
	return n, err
}

// failed names the body's codings in a decoding error.
func (d *decoder) failed(err error) error {
	return fmt.Errorf("decoding the %s body: %w", strings.Join(d.codings, ", "), err)
}

// open stacks a decoder for each coding on the body, the last applied
// first.
func (d *decoder) open() (io.Reader, error) {
	r := d.body
	for i := len(d.codings) - 1; i >= 0; i-- {
		var err error
		switch d.codings[i] {
		case "gzip", "x-gzip":
			r, err = gzip.NewReader(r)
		case "deflate":
			r, err = zlib.NewReader(r)
		case "br":
			// Its ring buffer, as large as the window its stream's
			// header declares (up to 16 MiB), is held while it decodes.
			br := bufio.NewReader(r)
			head, _ := br.Peek(1) // an empty body fails below
			if d.hold != nil {
				if err := d.hold(brotliWindow(head)); err != nil {
					return nil, err
				}
			}
			r = brotli.NewReader(br)
		case "zstd":
			// Its window, up to 8 MiB, is held twice while it decodes:
			// weighed from the first frame's header before the decoder
			// sees it, and no later frame of the body may declare a larger
			// one.
			br := bufio.NewReader(r)
			head, _ := br.Peek(zstd.HeaderMaxSize) // a shorter body fails below
			window := zstdWindow(head)
			if d.hold != nil {
				if err := d.hold(2*int64(window) + zstdBlock); err != nil {
					return nil, err
				}
			}
			z := zstdDecoders.Get().(*zstd.Decoder)
			d.frees = append(d.frees, func() { _ = z.Reset(nil); zstdDecoders.Put(z) })
			err = z.ResetWithOptions(br, zstd.WithDecoderMaxWindow(max(window, zstd.MinWindowSize)))
			r = z
		}
		if err != nil {
			return nil, d.failed(err)
		}
	}
	return r, nil
}

// Close frees the decoders; the body is not read further.
func (d *decoder) Close() error {
	for _, f := range d.frees {
		f()
	}
	d.frees, d.r, d.err = nil, nil, errors.New("decoder closed")
	return nil
}

// brotliWindow is the window of a brotli stream whose first byte is
// head[0] (RFC 7932, section 9.1): 2^WBITS bytes, WBITS from 10 to 24; the
// largest for an empty head or a reserved code, which the decoder then
// refuses.
func brotliWindow(head []byte) int64 {
	const largest = 24
	if len(head) == 0 {
		return 1 << largest
	}
	b := head[0]
	bits := 16
	if b&1 != 0 {
		switch n, m := b>>1&7, b>>4&7; {
		case n != 0:
			bits = 17 + int(n)
		case m == 1: // reserved (the large window of a later extension)
			bits = largest
		case m != 0:
			bits = 8 + int(m)
		default:
			bits = 17
		}
	}
	return 1 << bits
}

// zstdMaxWindow is the largest window a zstd body may use, the one RFC
// 9659 sets for the zstd content coding: it bounds a decoder's memory.
const zstdMaxWindow = 8 << 20

// zstdWindow is the window of a zstd body whose first frame's header is
// head, what its decoder's buffers take twice (and a block, zstdBlock):
// the frame's window, its whole content for a frame of one segment, the
// most when the header does not tell.
func zstdWindow(head []byte) uint64 {
	var h zstd.Header
	w := uint64(zstdMaxWindow)
	if h.Decode(head) == nil {
		switch {
		case h.SingleSegment && h.HasFCS:
			w = min(w, h.FrameContentSize)
		case h.WindowSize > 0:
			w = min(w, h.WindowSize)
		}
	}
	return w
}

// zstdBlock is the largest block of a zstd frame.
const zstdBlock = 128 << 10

// zstdDecoders keeps zstd decoders, which are costly to make, for reuse;
// each decodes in the goroutine that reads it.
var zstdDecoders = sync.Pool{New: func() any {
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(zstdMaxWindow))
	if err != nil {
		panic(err) // the options are constant and valid
	}
	return d
}}

// decodes tells whether the proxy decodes every coding of a request's
// body.
func decodes(h http.Header) bool {
	_, ok := bodyCodings(h)
	return ok
}
