// Package vectorfile writes and checks the protocol's test-vector files
// (testdata/*vectors.json): each package's test builds its file from the
// code and fails when the stored one differs.
package vectorfile

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Digest is a 64-bit digest in both spellings.
type Digest struct {
	Hex string `json:"hex"`
	Dec string `json:"dec"`
}

// NewDigest returns v as 16 lowercase hex digits and as the signed decimal
// int64 stored in Redis.
func NewDigest(v uint64) Digest {
	return Digest{Hex: fmt.Sprintf("%016x", v), Dec: strconv.FormatInt(int64(v), 10)}
}

// CheckDigest checks d against want, and that its two spellings agree.
func CheckDigest(t *testing.T, d Digest, want uint64, what string) {
	t.Helper()
	assert.Equal(t, fmt.Sprintf("%016x", want), d.Hex, what)
	v, err := strconv.ParseUint(d.Hex, 16, 64)
	require.NoError(t, err, what)
	assert.Equal(t, strconv.FormatInt(int64(v), 10), d.Dec, "%s: dec is the signed int64 of hex", what)
}

// Text sets a plain field, or a hex one for a text that is not valid UTF-8.
func Text(s string) (*string, string) {
	if utf8.ValidString(s) {
		return &s, ""
	}
	return nil, hex.EncodeToString([]byte(s))
}

// UnText reads back a field set by Text.
func UnText(t testing.TB, s *string, h string) string {
	t.Helper()
	if s != nil {
		return *s
	}
	b, err := hex.DecodeString(h)
	require.NoError(t, err)
	return string(b)
}

func encode(t *testing.T, v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	require.NoError(t, enc.Encode(v))
	return b.Bytes()
}

// Check compares the file at path with v encoded, byte for byte, after
// rewriting it when update is set; regen is the command that rewrites it.
func Check(t *testing.T, path string, v any, update bool, regen string) {
	want := encode(t, v)
	if update {
		require.NoError(t, os.WriteFile(path, want, 0o644))
	}
	got, err := os.ReadFile(path)
	require.NoError(t, err, "run %s to create it", regen)
	if bytes.Equal(want, got) {
		return
	}
	wl, gl := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	i := 0
	for i < len(wl) && i < len(gl) && wl[i] == gl[i] {
		i++
	}
	line := func(ls []string) string {
		if i < len(ls) {
			return ls[i]
		}
		return "<end of file>"
	}
	t.Fatalf("%s differs from the code at line %d:\n  file: %s\n  code: %s\nrun %s after an intended protocol change",
		path, i+1, line(gl), line(wl), regen)
}

// Load decodes the file at path into v, refusing unknown fields.
func Load(t *testing.T, path string, v any) {
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(v))
}
