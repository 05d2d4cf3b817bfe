package fingerprint

import (
	"encoding/json"
	"slices"
)

// Mismatch says where a request departs from the transcript it was meant to
// continue, for logs and for operators replaying traffic.
type Mismatch struct {
	// Prompt lists, sorted, the body members outside input whose canonical
	// values differ (a member present on one side only included).
	Prompt []string
	// Item is the index of the first transcript item the request does not
	// repeat, -1 when it repeats them all. An index at or past the
	// request's Len means the request is shorter than the transcript.
	Item int
	// Members lists, sorted, the top-level members of that item whose
	// canonical values differ, when both items are objects.
	Members []string
}

// Explain compares next with the transcript of prev followed by output, by
// the rules of the parser that parsed prev. next must come from the same
// parser (ErrInvalidRequest otherwise), and the output items must be valid
// JSON.
func Explain(prev *Request, output []json.RawMessage, next *Request) (Mismatch, error) {
	m := Mismatch{Item: -1}
	p := prev.parser
	if next.parser != p {
		return m, errorf("requests from different parsers")
	}
	a, err := canonicalMembers(prev.body, p.rules, placeBody)
	if err != nil {
		return m, err
	}
	b, err := canonicalMembers(next.body, p.rules, placeBody)
	if err != nil {
		return m, err
	}
	m.Prompt = differing(a, b)
	transcript := slices.Concat(prev.Items(), output)
	for i, item := range transcript {
		if i >= next.Len() {
			m.Item = i
			break
		}
		x, err := canonical(item, p.rules, placeItem)
		if err != nil {
			return m, err
		}
		y, _ := canonical(next.Item(i), p.rules, placeItem)
		if string(x) == string(y) {
			continue
		}
		m.Item = i
		xm, errx := canonicalMembers(x, nil, placeExact)
		ym, erry := canonicalMembers(y, nil, placeExact)
		if errx == nil && erry == nil {
			m.Members = differing(xm, ym)
		}
		break
	}
	return m, nil
}

// canonicalMembers returns the canonical value of each top-level member of
// the object doc at pl (without the members pl leaves out).
func canonicalMembers(doc []byte, r *rules, pl place) (map[string]json.RawMessage, error) {
	c, err := canonical(doc, r, pl)
	if err != nil {
		return nil, err
	}
	var ms map[string]json.RawMessage
	if err := json.Unmarshal(c, &ms); err != nil {
		return nil, errorf("not an object")
	}
	return ms, nil
}

// differing returns, sorted, the keys whose values differ between a and b.
func differing(a, b map[string]json.RawMessage) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok || string(v) != string(w) {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
