// Package names checks the ids and names that end up in Redis keys and
// values: owner ids, session ids, replica names and references,
// namespaces.
package names

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Check returns an error saying what is wrong with s, to follow the name of
// the field: "is empty", "is 300 bytes, more than 256", "is not valid
// UTF-8" or "has a control character U+000A at byte 3". It accepts any
// non-empty valid UTF-8 of at most max bytes without control characters.
func Check(s string, max int) error {
	switch {
	case s == "":
		return errors.New("is empty")
	case len(s) > max:
		return fmt.Errorf("is %d bytes, more than %d", len(s), max)
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("has a control character %U at byte %d", r, i)
		}
	}
	return nil
}

// MaxNamespaceBytes bounds a namespace.
const MaxNamespaceBytes = 64

// Namespace returns an error saying what is wrong with a key namespace:
// what Check refuses within MaxNamespaceBytes, or a space, '{' or '}' (a
// namespace is part of every hash tag).
func Namespace(ns string) error {
	if err := Check(ns, MaxNamespaceBytes); err != nil {
		return err
	}
	if strings.ContainsAny(ns, "{} ") {
		return errors.New("holds a space, '{' or '}'")
	}
	return nil
}

// MaxReplicaBytes bounds a replica name.
const MaxReplicaBytes = 256

// replicaRefPrefix starts a replica reference; no replica name starts with
// it.
const replicaRefPrefix = "#"

// Replica returns an error saying what is wrong with a replica name: what
// Check refuses within MaxReplicaBytes, or a leading '#', which starts
// replica references (ReplicaRef).
func Replica(name string) error {
	if err := Check(name, MaxReplicaBytes); err != nil {
		return err
	}
	if strings.HasPrefix(name, replicaRefPrefix) {
		return errors.New("starts with '#'")
	}
	return nil
}

// ReplicaDigest returns the 64-bit digest by which an owner's state and the
// directory know a replica: xxhash64 of its name, or the digest a
// reference (ReplicaRef) spells.
func ReplicaDigest(replica string) uint64 {
	if d, ok := parseReplicaRef(replica); ok {
		return d
	}
	return xxhash.Sum64String(replica)
}

// ReplicaRef returns the reference that names a replica known only by its
// digest: '#' and the digest's 16 lowercase hex digits. The reference of a
// name is that of its digest; a reference is its own.
func ReplicaRef(digest uint64) string {
	var b [1 + 16]byte
	b[0] = replicaRefPrefix[0]
	hex.Encode(b[1:], binary.BigEndian.AppendUint64(nil, digest))
	return string(b[:])
}

// IsReplicaRef reports whether s is a replica reference (ReplicaRef).
func IsReplicaRef(s string) bool {
	_, ok := parseReplicaRef(s)
	return ok
}

func parseReplicaRef(s string) (uint64, bool) {
	digits, ok := strings.CutPrefix(s, replicaRefPrefix)
	if !ok || len(digits) != 16 || strings.ToLower(digits) != digits {
		return 0, false
	}
	b, err := hex.DecodeString(digits)
	if err != nil {
		return 0, false
	}
	return binary.BigEndian.Uint64(b), true
}
