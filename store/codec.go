package store

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/internal/names"
)

// The first byte of an encoded continuation: how its response id and its
// socket's replica are held.
const (
	continuationFormat    = 3 // the response id as it is; the replica's digest
	continuationHexFormat = 4 // an id of the form "resp_" + lowercase hex, as the bytes the hex spells; the replica's digest

	// Formats written before replicas were held by their digest, still
	// read: the replica's name to the end.
	continuationNamedFormat    = 1
	continuationNamedHexFormat = 2
)

// responseIDPrefix starts the response ids OpenAI gives ("resp_" and 48
// lowercase hex digits), which the packed format holds in half the bytes.
const responseIDPrefix = "resp_"

// encodeContinuation returns c as an owner's state holds it (field c, see
// internal/lua/reserve.lua); Lua never reads it:
//
//	format byte: 3, or 4 when the response id is "resp_" followed by an
//	  even number of lowercase hex digits
//	uvarint transcript items, uvarint transcript bytes
//	8 bytes transcript digest, 8 bytes prompt signature (big-endian)
//	uvarint socket id (0 for any socket), uvarint length of the response id
//	  field, which holds the id (format 3) or the bytes its hex digits
//	  spell (format 4)
//	response id field, then, unless the socket id is 0, the 8-byte digest
//	  of the socket's replica (big-endian, names.ReplicaDigest);
//	  when the socket id is 0, the transcript's references, each as
//	  uvarint(items - item) and its 8-byte mask (big-endian), in
//	  increasing order of item, as many as fit in compactValue bytes
//
// The replica's digest keeps the state within Redis's compact hash
// encoding (values of at most 64 bytes) whatever the replica's name.
func encodeContinuation(c continuation) []byte {
	return appendContinuation(make([]byte, 0, 1+3*binary.MaxVarintLen64+16+len(c.ResponseID)+8), c)
}

// appendContinuation appends encodeContinuation's encoding of c to b.
func appendContinuation(b []byte, c continuation) []byte {
	start := len(b)
	format, id := continuationFormat, c.ResponseID
	if digits, ok := packedResponseID(c.ResponseID); ok {
		format, id = continuationHexFormat, digits
	}
	b = append(b, byte(format))
	b = binary.AppendUvarint(b, uint64(c.Transcript.Items))
	b = binary.AppendUvarint(b, uint64(c.Transcript.Bytes))
	b = binary.BigEndian.AppendUint64(b, c.Transcript.Digest)
	b = binary.BigEndian.AppendUint64(b, c.Signature)
	sock := c.Origin.ID
	if c.Origin.Any {
		sock = 0
	}
	b = binary.AppendUvarint(b, sock)
	if format == continuationHexFormat {
		b = binary.AppendUvarint(b, uint64(len(id)/2))
		for i := 0; i < len(id); i += 2 {
			b = append(b, unhex(id[i])<<4|unhex(id[i+1]))
		}
	} else {
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
	}
	if sock != 0 {
		return binary.BigEndian.AppendUint64(b, names.ReplicaDigest(c.Origin.Replica))
	}
	for _, r := range c.Transcript.References {
		back := uint64(c.Transcript.Items - r.Item)
		if len(b)-start+uvarintLen(back)+8 > compactValue {
			break
		}
		b = binary.AppendUvarint(b, back)
		b = binary.BigEndian.AppendUint64(b, r.Mask)
	}
	return b
}

// asStored returns c as an owner's state gives it back, with the
// references its encoding keeps, and the length of that encoding.
func asStored(c continuation) (continuation, int) {
	enc := encodeContinuation(c)
	if back, err := decodeContinuation(enc); err == nil { // enc is c's encoding: it decodes
		c.Transcript.References = back.Transcript.References
	}
	return c, len(enc)
}

// compactValue is the longest value Redis keeps in a hash's compact
// encoding by default (hash-max-listpack-value): references are left out
// of a continuation rather than make it longer.
const compactValue = 64

// uvarintLen returns the length of x in binary.AppendUvarint's encoding.
func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}

// packedResponseID returns the hex digits of an id "resp_<hex>" when they
// are lowercase and even in number, so that hex.EncodeToString gives back
// exactly what they spell.
func packedResponseID(id string) (string, bool) {
	digits, ok := strings.CutPrefix(id, responseIDPrefix)
	if !ok || digits == "" || len(digits)%2 != 0 {
		return "", false
	}
	for i := range len(digits) {
		if c := digits[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", false
		}
	}
	return digits, true
}

// unhex returns the value of a lowercase hex digit.
func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

// decodeReferences reads the references of a transcript of items items:
// pairs of uvarint(items - item) and an 8-byte mask, items increasing.
func decodeReferences(b []byte, items int) ([]fingerprint.Reference, bool) {
	var refs []fingerprint.Reference
	for len(b) > 0 {
		back, n := binary.Uvarint(b)
		if n <= 0 || back == 0 || back > uint64(items) || len(b) < n+8 {
			return nil, false
		}
		item := items - int(back)
		if len(refs) > 0 && item <= refs[len(refs)-1].Item {
			return nil, false
		}
		refs = append(refs, fingerprint.Reference{Item: item, Mask: binary.BigEndian.Uint64(b[n:])})
		b = b[n+8:]
	}
	return refs, true
}

// decodeContinuation reads what encodeContinuation wrote.
func decodeContinuation(b []byte) (continuation, error) {
	bad := func(what string) (continuation, error) {
		return continuation{}, fmt.Errorf("%w: continuation: %s", errBadReply, what)
	}
	if len(b) == 0 || b[0] < continuationNamedFormat || b[0] > continuationHexFormat {
		return bad("unknown format")
	}
	format := b[0]
	b = b[1:]
	var c continuation
	var fields [3]uint64
	for i := range 2 {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > 1<<62 {
			return bad("transcript size")
		}
		fields[i], b = v, b[n:]
	}
	c.Transcript.Items, c.Transcript.Bytes = int(fields[0]), int64(fields[1])
	if len(b) < 16 {
		return bad("truncated digests")
	}
	c.Transcript.Digest = binary.BigEndian.Uint64(b)
	c.Signature = binary.BigEndian.Uint64(b[8:])
	b = b[16:]
	id, n := binary.Uvarint(b)
	if n <= 0 {
		return bad("socket id")
	}
	b = b[n:]
	size, n := binary.Uvarint(b)
	if n <= 0 || size == 0 || size > uint64(len(b)-n) {
		return bad("response id")
	}
	b = b[n:]
	if format == continuationHexFormat || format == continuationNamedHexFormat {
		var buf [128]byte
		c.ResponseID = string(hex.AppendEncode(append(buf[:0], responseIDPrefix...), b[:size]))
	} else {
		c.ResponseID = string(b[:size])
	}
	replica := b[size:]
	switch {
	case id == 0 && (format == continuationNamedFormat || format == continuationNamedHexFormat):
		c.Origin = Socket{Any: true}
	case id == 0:
		c.Origin = Socket{Any: true}
		refs, ok := decodeReferences(replica, c.Transcript.Items)
		if !ok {
			return bad("references")
		}
		c.Transcript.References = refs

	case format == continuationNamedFormat || format == continuationNamedHexFormat:
		c.Origin = Socket{Replica: replicaRef(string(replica)), ID: id}
	case len(replica) != 8:
		return bad("replica digest")
	default:
		c.Origin = Socket{Replica: names.ReplicaRef(binary.BigEndian.Uint64(replica)), ID: id}
	}
	return c, nil
}
