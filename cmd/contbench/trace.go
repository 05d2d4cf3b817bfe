package main

// Trace files: what a line of one holds, and how a line that is not one
// is told apart and described.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"

	"github.com/contstore/contstore/identity"
)

// traceLine is one upstream call of a trace.
type traceLine struct {
	Owner *struct {
		Session string `json:"session"`
		Agent   string `json:"agent"`
	} `json:"owner"`
	// Headers are the request headers the trace kept, by name; a value
	// is a string or an array of strings.
	Headers    map[string]json.RawMessage `json:"headers"`
	Request    json.RawMessage            `json:"request"`
	ResponseID string                     `json:"response_id"`
	Output     []json.RawMessage          `json:"output"`
}

// parseTraceLine decodes raw into tl and returns the owner it names: the
// zero owner when it names none (no owner, or an empty session), for the
// replay to derive as a gateway does.
func parseTraceLine(raw []byte, tl *traceLine) (identity.Owner, error) {
	if err := json.Unmarshal(raw, tl); err != nil {
		return identity.Owner{}, traceLineError(err)
	}
	if len(tl.Request) == 0 || string(tl.Request) == "null" {
		return identity.Owner{}, errors.New(`no "request"`)
	}
	switch {
	case tl.Owner == nil || tl.Owner.Session == "":
		return identity.Owner{}, nil
	case tl.Owner.Agent == "":
		return identity.Main(tl.Owner.Session)
	default:
		return identity.Agent(tl.Owner.Session, tl.Owner.Agent)
	}
}

// header returns the line's headers as a request would carry them.
func (tl *traceLine) header() (http.Header, error) {
	h := make(http.Header, len(tl.Headers))
	for name, raw := range tl.Headers {
		var v string
		if err := json.Unmarshal(raw, &v); err == nil {
			h.Add(name, v)
			continue
		}
		var vs []string
		if err := json.Unmarshal(raw, &vs); err != nil {
			return nil, fmt.Errorf("header %q is neither a string nor an array of strings", name)
		}
		for _, v := range vs {
			h.Add(name, v)
		}
	}
	return h, nil
}

// traceLineError says why a line that did not decode is not a trace
// line, in the trace's terms rather than Go's.
func traceLineError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field == "":
		return fmt.Errorf("not a JSON object but %s", jsonKind(typeErr.Value))
	case errors.As(err, &typeErr):
		return fmt.Errorf("%q is %s, want %s", typeErr.Field, jsonKind(typeErr.Value), jsonKind(jsonValueOf(typeErr.Type)))
	case errors.As(err, &syntaxErr):
		return fmt.Errorf("not JSON: %v, at byte %d", err, syntaxErr.Offset)
	}
	return err
}

// jsonKind names a JSON value as encoding/json names its kind ("object",
// "array", "string", "number", "bool"), with an article.
func jsonKind(value string) string {
	switch value {
	case "object", "array":
		return "an " + value
	case "bool":
		return "a boolean"
	}
	return "a " + value
}

// jsonValueOf returns the kind of JSON value a Go type decodes from.
func jsonValueOf(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map, reflect.Pointer:
		return "object"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	}
	return "number"
}

// checkTrace returns an error unless the file at path can be read and
// holds more than white space.
func checkTrace(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	for {
		b, err := br.ReadByte()
		switch {
		case errors.Is(err, io.EOF):
			return fmt.Errorf("no turns in %s: the file is empty", path)
		case err != nil:
			return fmt.Errorf("reading %s: %w", path, err)
		case !isJSONSpace(b):
			return nil
		}
	}
}

// isJSONSpace reports whether b is white space between JSON values.
func isJSONSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }
