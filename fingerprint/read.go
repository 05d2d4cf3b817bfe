package fingerprint

import (
	"errors"
	"io"
)

// ReadRequest reads a request body of size bytes from r and parses it as
// Parse does; a negative size reads r to its end. While a body of known
// size arrives, ReadRequest does what it can with the part that is in: it
// finds where the input array opens and hashes the array's bytes against
// the runs of input arrays that began alike (the run cache), so that
// little is left to do once the last byte is in.
//
// An error reading r is returned as it is, io.ErrUnexpectedEOF when r ends
// before size bytes; an invalid body gives Parse's errors, which wrap
// ErrInvalidRequest. A reader that is a BodyChecker checks the body
// before the parse.
func (p *Parser) ReadRequest(r io.Reader, size int) (*Request, error) {
	bc, _ := r.(BodyChecker)
	if size < 0 {
		body, err := io.ReadAll(r)
		if err == nil && bc != nil {
			err = bc.CheckBody(body)
		}
		if err != nil {
			return nil, err
		}
		return p.Parse(body)
	}
	body := make([]byte, size)
	a := arrival{input: -1}
	for n := 0; n < size; {
		k, err := r.Read(body[n:])
		n += k
		if p.runs != nil && k > 0 {
			a.take(p.runs, body[:n])
		}
		if err != nil && n < size {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	if bc != nil {
		if err := bc.CheckBody(body); err != nil {
			return nil, err
		}
	}
	return p.parse(body, false, &a)
}

// A BodyChecker is a reader that ReadRequest gives the whole body once it
// is in, before it parses it: an error CheckBody returns is ReadRequest's,
// and nothing is parsed. A gateway weighs what the parse will keep there.
type BodyChecker interface {
	CheckBody(body []byte) error
}

// arrival is what ReadRequest learns of a body while it arrives: where the
// input array opens, found by walking the top-level members as far as
// they are in, and the array's runMatch.
type arrival struct {
	at    int  // where the walk stands: after '{', or after a member
	input int  // the input array's '[', -1 until found
	done  bool // the walk found no input array to match, or the body is not one
	// The body's bytes when the walk last stopped inside a member: it goes
	// on once they have doubled, so that a long member is walked over a
	// few times, not once a read.
	stopped int
	match   runMatch
}

// take takes data, the body's bytes so far.
func (a *arrival) take(c *runCache, data []byte) {
	if a.input < 0 && !a.done && len(data) >= 2*a.stopped {
		a.walk(data)
		a.stopped = len(data)
	}
	if a.input >= 0 {
		a.match.feed(c, data[a.input:], false)
	}
}

// walk walks the body's top-level members from a.at as far as data holds
// them whole, without validating them (Parse does), until it reaches the
// input: an array, whose '[' it notes, or anything else, or a member
// before it that says the upstream holds the conversation (Parse skips
// the input then).
func (a *arrival) walk(data []byte) {
	i := skipSpace(data, a.at)
	if a.at == 0 {
		if i >= len(data) {
			return
		}
		if data[i] != '{' {
			a.done = true
			return
		}
		a.at = i + 1
	}
	for {
		i = skipSpace(data, a.at)
		if i < len(data) && data[i] == ',' {
			i = skipSpace(data, i+1)
		}
		if i >= len(data) {
			return
		}
		if data[i] != '"' {
			a.done = true // the body's end, or not JSON
			return
		}
		end := skipString(data, i+1)
		if end < 0 {
			return
		}
		key := string(data[i+1 : end-1])
		j := skipSpace(data, end)
		if j < len(data) && data[j] == ':' {
			j = skipSpace(data, j+1)
		}
		if j >= len(data) {
			return
		}
		switch {
		case key == "input":
			if data[j] == '[' {
				a.input = j
			}
			a.done = true
			return
		case (key == "previous_response_id" || key == "conversation") && data[j] != 'n':
			a.done = true // not null: the upstream holds the conversation
			return
		}
		if j = skipValue(data, j); j < 0 {
			return
		}
		a.at = j
	}
}

// skipValue returns the end of the value at data[i], by its brackets and
// strings alone, or -1 when data ends first or may end within it.
func skipValue(data []byte, i int) int {
	switch data[i] {
	case '{', '[':
		return skipObject(data, i)
	case '"':
		return skipString(data, i+1)
	}
	for ; i < len(data); i++ {
		switch data[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return -1
}
