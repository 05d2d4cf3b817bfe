package session

import (
	"encoding/binary"
	"encoding/json"

	"github.com/cespare/xxhash/v2"
)

// messageChain fingerprints a message list: its length and a chain digest
// of every message's bytes, so a later list can be recognised as an
// append-only extension of it.
type messageChain struct {
	count  int
	digest uint64
}

func chainOf(msgs []json.RawMessage) messageChain {
	c := messageChain{}
	for _, m := range msgs {
		c = c.extend(m)
	}
	return c
}

func (c messageChain) extend(m json.RawMessage) messageChain {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], c.digest)
	binary.LittleEndian.PutUint64(buf[8:], xxhash.Sum64(m))
	return messageChain{count: c.count + 1, digest: xxhash.Sum64(buf[:])}
}

// extendedBy reports whether msgs starts with the messages c describes.
func (c messageChain) extendedBy(msgs []json.RawMessage) bool {
	return len(msgs) >= c.count && chainOf(msgs[:c.count]) == c
}
