package store

import (
	"encoding/binary"
	"fmt"
)

// continuationFormat is the first byte of an encoded continuation.
const continuationFormat = 1

// encodeContinuation returns c as an owner's state holds it (field c, see
// lua/reserve.lua); Lua never reads it:
//
//	format byte 1
//	uvarint transcript items, uvarint transcript bytes
//	8 bytes transcript digest, 8 bytes prompt signature (big-endian)
//	uvarint socket id (0 for any socket), uvarint response id length
//	response id, then the socket's replica to the end
func encodeContinuation(c continuation) []byte {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+16+len(c.ResponseID)+len(c.Origin.Replica))
	b = append(b, continuationFormat)
	b = binary.AppendUvarint(b, uint64(c.Transcript.Items))
	b = binary.AppendUvarint(b, uint64(c.Transcript.Bytes))
	b = binary.BigEndian.AppendUint64(b, c.Transcript.Digest)
	b = binary.BigEndian.AppendUint64(b, c.Signature)
	id, replica := c.Origin.ID, c.Origin.Replica
	if c.Origin.Any {
		id, replica = 0, ""
	}
	b = binary.AppendUvarint(b, id)
	b = binary.AppendUvarint(b, uint64(len(c.ResponseID)))
	b = append(b, c.ResponseID...)
	return append(b, replica...)
}

// decodeContinuation reads what encodeContinuation wrote.
func decodeContinuation(b []byte) (continuation, error) {
	bad := func(what string) (continuation, error) {
		return continuation{}, fmt.Errorf("%w: continuation: %s", errBadReply, what)
	}
	if len(b) == 0 || b[0] != continuationFormat {
		return bad("unknown format")
	}
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
	c.ResponseID = string(b[:size])
	c.Origin = Socket{Replica: string(b[size:]), ID: id}
	if id == 0 {
		c.Origin = Socket{Any: true}
	}
	return c, nil
}
