package session

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTitleIsTheFirstUserMessageText(t *testing.T) {
	s := New("m", "", "")
	s.Messages = append(s.Messages,
		[]byte(`{"role":"system","content":"ignored"}`),
		[]byte(`{"role":"user","content":[{"type":"input_text","text":"  Plan   a trip\nto Lisbon "}]}`))
	s.autoTitle()
	assert.Equal(t, "Plan a trip to Lisbon", s.Title)
	s.Messages[1] = []byte(`{"role":"user","content":"a very long first message that goes on and on well past the sixty character limit"}`)
	s.Title = ""
	s.autoTitle()
	assert.Len(t, []rune(s.Title), 60)
	s.Title = "kept"
	s.autoTitle()
	assert.Equal(t, "kept", s.Title)
}
