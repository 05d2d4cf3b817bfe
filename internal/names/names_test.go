package names_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/contstore/contstore/internal/names"
)

func TestCheck(t *testing.T) {
	for s, want := range map[string]string{
		"":          "is empty",
		"abcdefghi": "is 9 bytes, more than 8",
		"a\xff":     "is not valid UTF-8",
		"a\nb":      "has a control character U+000A at byte 1",
		"a\u0085":   "has a control character U+0085 at byte 1",
	} {
		assert.EqualError(t, names.Check(s, 8), want, "%q", s)
	}
	assert.NoError(t, names.Check("é:{x} y", 8))
}

func TestNamespace(t *testing.T) {
	for ns, want := range map[string]string{
		"":                      "is empty",
		"a b":                   "holds a space, '{' or '}'",
		"a{b":                   "holds a space, '{' or '}'",
		strings.Repeat("n", 65): "is 65 bytes, more than 64",
	} {
		assert.EqualError(t, names.Namespace(ns), want, "%q", ns)
	}
	assert.NoError(t, names.Namespace("cont:é"))
}
