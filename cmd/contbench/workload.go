package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// A client keeps its transcript below maxTranscriptItems items: past it, it
// compacts the history into a summary followed by the last
// keptAfterCompaction items, as coding agents do. Compaction breaks the
// append-only chain once, like an edit.
const (
	maxTranscriptItems  = 64
	keptAfterCompaction = 8
)

// tools is the function tools every request declares.
var tools = json.RawMessage(`[{"type":"function","name":"run_tests","description":"Run the tests of a package and report failures","parameters":{"type":"object","properties":{"path":{"type":"string"},"race":{"type":"boolean"}},"required":["path"]}},{"type":"function","name":"read_file","description":"Read a file of the repository","parameters":{"type":"object","properties":{"path":{"type":"string"},"offset":{"type":"integer"},"limit":{"type":"integer"}},"required":["path"]}}]`)

// vocabulary feeds the generated texts.
var vocabulary = strings.Fields(`the a an of to in for on with and or but not this that it is was be
	replica gateway socket session agent store cache Redis cluster partition owner turn response request
	test build deploy rollback latency timeout retry budget memory eviction transcript prompt delta
	function call output result error failing passing fixed check read write file package module line
	please could you run again explain why what where when how should would we I think maybe now later`)

// prompt holds a request's fields besides input: what the store's prompt
// signature covers.
type prompt struct {
	Model        string          `json:"model"`
	Instructions string          `json:"instructions"`
	Tools        json.RawMessage `json:"tools"`
	ServiceTier  string          `json:"service_tier"`
	Store        bool            `json:"store"`
}

// Item shapes of the Responses API.
type (
	inputText struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	outputText struct {
		Type        string     `json:"type"`
		Text        string     `json:"text"`
		Annotations []struct{} `json:"annotations"`
	}
	message struct {
		Type    string `json:"type"`
		ID      string `json:"id,omitempty"`
		Role    string `json:"role"`
		Status  string `json:"status,omitempty"`
		Content any    `json:"content"`
	}
	functionCall struct {
		Type      string `json:"type"`
		ID        string `json:"id"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
		Status    string `json:"status"`
	}
	functionCallOutput struct {
		Type   string `json:"type"`
		CallID string `json:"call_id"`
		Output string `json:"output"`
	}
)

// marshal encodes one of the item shapes above, which cannot fail.
func marshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// text returns words from the vocabulary, minLen to maxLen bytes long.
func text(rng *rand.Rand, minLen, maxLen int) string {
	n := minLen + rng.IntN(maxLen-minLen+1)
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
	}
	return b.String()
}

// userMessage returns a user message of a few sentences.
func userMessage(rng *rand.Rand, prefix string) json.RawMessage {
	return marshal(message{Type: "message", Role: "user",
		Content: []inputText{{Type: "input_text", Text: prefix + text(rng, 40, 400)}}})
}

// reply returns the output of response id: an assistant message and,
// one time in three, a function call, whose call id it returns.
func reply(rng *rand.Rand, id string) (output []json.RawMessage, call string) {
	output = []json.RawMessage{marshal(message{Type: "message", ID: "msg_" + id, Role: "assistant", Status: "completed",
		Content: []outputText{{Type: "output_text", Text: text(rng, 80, 600), Annotations: []struct{}{}}}})}
	if rng.IntN(3) == 0 {
		call = "call_" + id
		var args []byte
		if rng.IntN(2) == 0 {
			args = marshal(map[string]any{"path": "./" + vocabulary[rng.IntN(len(vocabulary))], "race": rng.IntN(2) == 0})
			output = append(output, marshal(functionCall{Type: "function_call", ID: "fc_" + id, CallID: call,
				Name: "run_tests", Arguments: string(args), Status: "completed"}))
		} else {
			args = marshal(map[string]any{"path": "store/" + vocabulary[rng.IntN(len(vocabulary))] + ".go", "offset": rng.IntN(400), "limit": 80})
			output = append(output, marshal(functionCall{Type: "function_call", ID: "fc_" + id, CallID: call,
				Name: "read_file", Arguments: string(args), Status: "completed"}))
		}
	}
	return output, call
}

// initPrompt gives o its first prompt; store is the request's store field.
func (o *owner) initPrompt(store bool) {
	model := "gpt-5"
	if o.id.IsAgent() {
		model = "gpt-5-mini"
	}
	o.setPrompt(prompt{Model: model, Instructions: o.instructions(1), Tools: tools, ServiceTier: "auto", Store: store})
}

// instructions returns revision rev of o's instructions.
func (o *owner) instructions(rev int) string {
	role := "main coding assistant"
	if o.id.IsAgent() {
		role = "sub-agent " + o.id.AgentID()
	}
	return fmt.Sprintf("You are the %s of session %s. Read the code before changing it, run the tests "+
		"before claiming a fix, and answer tersely. Instructions revision %d.", role, o.id.Session(), rev)
}

// setPrompt makes p o's prompt from now on.
func (o *owner) setPrompt(p prompt) {
	o.prompt = p
	o.promptGen++
	head := marshal(p)
	o.head = append(head[:len(head)-1:len(head)-1], `,"input":[`...)
}

// changePrompt changes o's instructions or service tier.
func (o *owner) changePrompt(rng *rand.Rand) {
	p := o.prompt
	if rng.IntN(2) == 0 {
		p.Instructions = o.instructions(o.promptGen + 1)
	} else if p.ServiceTier == "auto" {
		p.ServiceTier = "flex"
	} else {
		p.ServiceTier = "auto"
	}
	o.setPrompt(p)
}

// edit rewrites an earlier item of o's transcript, as a client that lets
// its user edit history does.
func (o *owner) edit(rng *rand.Rand) {
	t := slices.Clone(o.transcript)
	t[rng.IntN(len(t))] = userMessage(rng, "Edited: ")
	o.transcript = t
}

// compact replaces o's transcript with a summary and its last items.
func (o *owner) compact(rng *rand.Rand) {
	t := make([]json.RawMessage, 0, keptAfterCompaction+1)
	t = append(t, userMessage(rng, "Summary of the conversation so far: "))
	o.transcript = append(t, o.transcript[len(o.transcript)-keptAfterCompaction:]...)
}

// newItems returns the 1 to 3 items the client adds this turn: the output
// of the function call the last response asked for, if any, then user
// messages.
func (o *owner) newItems(rng *rand.Rand) []json.RawMessage {
	n := 1 + rng.IntN(3)
	items := make([]json.RawMessage, 0, n)
	if o.pendingCall != "" {
		items = append(items, marshal(functionCallOutput{Type: "function_call_output", CallID: o.pendingCall,
			Output: text(rng, 200, 700)}))
		o.pendingCall = ""
	}
	for len(items) < n {
		if o.opening != nil {
			items = append(items, o.opening)
			o.opening = nil
			continue
		}
		items = append(items, userMessage(rng, ""))
	}
	return items
}

// body returns the request body the client sends for input, with o's
// prompt fields.
func (o *owner) body(input []json.RawMessage) []byte {
	n := len(o.head) + 2
	for _, it := range input {
		n += len(it) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, o.head...)
	for i, it := range input {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, it...)
	}
	return append(b, "]}"...)
}

// size returns the bytes of items.
func size(items []json.RawMessage) int64 {
	var n int64
	for _, it := range items {
		n += int64(len(it))
	}
	return n
}
