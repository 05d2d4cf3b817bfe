package fakeupstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// The output items the upstream produces, with their members in the order
// the real API writes them.

// reasoningItem is a "reasoning" output item. EncryptedContent is set only
// when the request's include lists "reasoning.encrypted_content".
type reasoningItem struct {
	ID               string        `json:"id"`
	Type             string        `json:"type"`
	Summary          []summaryText `json:"summary"`
	EncryptedContent *string       `json:"encrypted_content,omitempty"`
}

// summaryText is one part of a reasoning item's summary.
type summaryText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// messageItem is an assistant "message" output item.
type messageItem struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

// outputText is one "output_text" content part of a message.
type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

// functionCallItem is a "function_call" output item.
type functionCallItem struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Status    string `json:"status"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

func newOutputText(text string) outputText {
	return outputText{Type: "output_text", Text: text, Annotations: []any{}, Logprobs: []any{}}
}

// inputItem is the part of an input (or transcript) item the script reads.
type inputItem struct {
	Type   string `json:"type"`
	Role   string `json:"role"`
	CallID string `json:"call_id"`
}

// kind is the item's type, "message" for a typeless item with a role (the
// easy input message form).
func (it inputItem) kind() string {
	if it.Type == "" && it.Role != "" {
		return "message"
	}
	return it.Type
}

// isUserMessage tells whether the item is a message from the user.
func (it inputItem) isUserMessage() bool {
	return it.kind() == "message" && it.Role == "user"
}

// parseInput splits a request's input member into items: an array gives its
// elements, a string is one user message, a missing or null input none.
func parseInput(input json.RawMessage) ([]json.RawMessage, error) {
	if len(input) == 0 || string(input) == "null" {
		return nil, nil
	}
	if input[0] == '"' {
		var text string
		if err := json.Unmarshal(input, &text); err != nil {
			return nil, fmt.Errorf("input: %w", err)
		}
		msg, err := json.Marshal(map[string]any{"role": "user", "content": text})
		if err != nil {
			return nil, err
		}
		return []json.RawMessage{msg}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(input, &items); err != nil || items == nil {
		return nil, errors.New("input must be a string or an array of items")
	}
	for i, raw := range items {
		var it inputItem
		if err := json.Unmarshal(raw, &it); err != nil {
			return nil, fmt.Errorf("input[%d] is not an item object: %v", i, err)
		}
		if it.kind() == "" {
			return nil, fmt.Errorf("input[%d] has neither type nor role", i)
		}
	}
	return items, nil
}

// mustMarshal marshals a value built from the upstream's own types, without
// escaping <, > and & (the real API writes them as they are).
func mustMarshal(v any) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err) // the upstream's own types always marshal
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
