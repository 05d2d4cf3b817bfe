package fakeupstream

import (
	"bytes"
	"encoding/json"
)

// object is a JSON object whose members keep the order they are given in,
// as the real API writes its events and response objects.
type object []member

type member struct {
	key   string
	value any
}

// MarshalJSON writes the members in order. A json.RawMessage value is
// written exactly as it is.
func (o object) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(mustMarshal(m.key))
		buf.WriteByte(':')
		if raw, ok := m.value.(json.RawMessage); ok && len(raw) > 0 {
			buf.Write(raw)
			continue
		}
		buf.Write(mustMarshal(m.value))
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// bytes is the object's JSON text.
func (o object) bytes() json.RawMessage {
	b, _ := o.MarshalJSON() // never fails
	return b
}
