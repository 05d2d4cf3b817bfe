// Package names checks the ids and names that end up in Redis keys and
// values: owner ids, session ids, replica ids, namespaces.
package names

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
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
