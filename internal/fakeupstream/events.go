package fakeupstream

import (
	"encoding/json"
)

// builder produces one response: its streaming events, in the order and
// with the members the API reference documents, and its output items.
type builder struct {
	req       *createRequest
	params    map[string]json.RawMessage // the request's members, as sent
	id        string
	createdAt int64
	chunks    int
	events    []Event
}

// emit appends an event: its type, its sequence number, then fields.
func (b *builder) emit(typ string, fields ...member) {
	o := append(object{{"type", typ}, {"sequence_number", len(b.events)}}, fields...)
	b.events = append(b.events, Event{Type: typ, Data: o.bytes()})
}

// start emits response.created and response.in_progress.
func (b *builder) start() {
	inProgress := b.response("in_progress", nil, nil, 0)
	b.emit("response.created", member{"response", inProgress})
	b.emit("response.in_progress", member{"response", inProgress})
}

// items emits the output items of move, up to the last
// response.output_item.done, and returns them.
func (b *builder) items(move Move, ids itemIDs) []json.RawMessage {
	var output []json.RawMessage
	if move.Reason != "" {
		output = append(output, b.reasoning(len(output), ids.reasoning, move.Reason))
	}
	if move.Call != nil {
		output = append(output, b.functionCall(len(output), ids, *move.Call))
	} else {
		output = append(output, b.message(len(output), ids.item, move.Say))
	}
	return output
}

// reasoning emits a reasoning item; its summary part only when the request
// asks for a summary.
func (b *builder) reasoning(index int, id, text string) json.RawMessage {
	b.emit("response.output_item.added", member{"output_index", index},
		member{"item", reasoningItem{ID: id, Type: "reasoning", Summary: []summaryText{}}})
	done := reasoningItem{ID: id, Type: "reasoning", Summary: []summaryText{}}
	if b.req.summarises() {
		at := []member{{"item_id", id}, {"output_index", index}, {"summary_index", 0}}
		b.emit("response.reasoning_summary_part.added", append(at, member{"part", summaryText{"summary_text", ""}})...)
		for _, d := range split(text, b.chunks) {
			b.emit("response.reasoning_summary_text.delta", append(at, member{"delta", d})...)
		}
		b.emit("response.reasoning_summary_text.done", append(at, member{"text", text})...)
		b.emit("response.reasoning_summary_part.done", append(at, member{"part", summaryText{"summary_text", text}})...)
		done.Summary = []summaryText{{"summary_text", text}}
	}
	if b.wantsEncrypted() {
		enc := encryptedContent(id)
		done.EncryptedContent = &enc
	}
	item := mustMarshal(done)
	b.emit("response.output_item.done", member{"output_index", index}, member{"item", item})
	return item
}

// message emits an assistant message with one output_text part.
func (b *builder) message(index int, id, text string) json.RawMessage {
	b.emit("response.output_item.added", member{"output_index", index},
		member{"item", messageItem{ID: id, Type: "message", Status: "in_progress", Role: "assistant", Content: []outputText{}}})
	at := []member{{"item_id", id}, {"output_index", index}, {"content_index", 0}}
	b.emit("response.content_part.added", append(at, member{"part", newOutputText("")})...)
	for _, d := range split(text, b.chunks) {
		b.emit("response.output_text.delta", append(at, member{"delta", d}, member{"logprobs", []any{}})...)
	}
	b.emit("response.output_text.done", append(at, member{"text", text}, member{"logprobs", []any{}})...)
	b.emit("response.content_part.done", append(at, member{"part", newOutputText(text)})...)
	item := mustMarshal(messageItem{ID: id, Type: "message", Status: "completed", Role: "assistant",
		Content: []outputText{newOutputText(text)}})
	b.emit("response.output_item.done", member{"output_index", index}, member{"item", item})
	return item
}

// functionCall emits a function call, its arguments in deltas.
func (b *builder) functionCall(index int, ids itemIDs, call Call) json.RawMessage {
	b.emit("response.output_item.added", member{"output_index", index},
		member{"item", functionCallItem{ID: ids.item, Type: "function_call", Status: "in_progress",
			CallID: ids.callID, Name: call.Name, Arguments: ""}})
	at := []member{{"item_id", ids.item}, {"output_index", index}}
	for _, d := range split(call.Arguments, b.chunks) {
		b.emit("response.function_call_arguments.delta", append(at, member{"delta", d})...)
	}
	b.emit("response.function_call_arguments.done", append(at, member{"arguments", call.Arguments})...)
	item := mustMarshal(functionCallItem{ID: ids.item, Type: "function_call", Status: "completed",
		CallID: ids.callID, Name: call.Name, Arguments: call.Arguments})
	b.emit("response.output_item.done", member{"output_index", index}, member{"item", item})
	return item
}

func (b *builder) wantsEncrypted() bool {
	for _, s := range b.req.Include {
		if s == "reasoning.encrypted_content" {
			return true
		}
	}
	return false
}

// response is the response object in a status: the request's parameters
// echoed as the real API echoes them, defaults where the request has none.
// usage and completedAt are set only once the response ends; why holds the
// "error" or "incomplete_details" member of a response that did not
// complete.
func (b *builder) response(status string, output []json.RawMessage, usage object, completedAt int64, why ...member) json.RawMessage {
	if output == nil {
		output = []json.RawMessage{}
	}
	var completed, usageValue any
	if completedAt != 0 {
		completed = completedAt
	}
	if usage != nil {
		usageValue = usage
	}
	o := object{
		{"id", b.id},
		{"object", "response"},
		{"created_at", b.createdAt},
		{"status", status},
		b.echo("background", false),
		{"completed_at", completed},
		{"error", nil},
		{"incomplete_details", nil},
		b.echo("instructions", nil),
		b.echo("max_output_tokens", nil),
		b.echo("max_tool_calls", nil),
		b.echo("model", nil),
		{"output", output},
		b.echo("parallel_tool_calls", true),
		b.echo("previous_response_id", nil),
		b.echo("prompt_cache_key", nil),
		b.echo("prompt_cache_retention", nil),
		b.echo("reasoning", object{{"effort", nil}, {"summary", nil}}),
		b.echo("safety_identifier", nil),
		b.echo("service_tier", "default"),
		b.echo("store", true),
		b.echo("temperature", 1.0),
		b.echo("text", object{{"format", object{{"type", "text"}}}, {"verbosity", "medium"}}),
		b.echo("tool_choice", "auto"),
		b.echo("tools", []any{}),
		b.echo("top_logprobs", 0),
		b.echo("top_p", 1.0),
		b.echo("truncation", "disabled"),
		{"usage", usageValue},
		b.echo("user", nil),
		b.echo("metadata", object{}),
	}
	for _, m := range why {
		for i := range o {
			if o[i].key == m.key {
				o[i] = m
			}
		}
	}
	return o.bytes()
}

// echo is the request's member key as sent, or def when it is absent or
// null.
func (b *builder) echo(key string, def any) member {
	if v, ok := b.params[key]; ok && string(v) != "null" {
		return member{key, v}
	}
	return member{key, def}
}

// split cuts s into at most n pieces of about equal length, on rune
// boundaries; an empty s is one empty piece.
func split(s string, n int) []string {
	r := []rune(s)
	if n > len(r) {
		n = len(r)
	}
	if n <= 1 {
		return []string{s}
	}
	pieces := make([]string, 0, n)
	for i := range n {
		pieces = append(pieces, string(r[i*len(r)/n:(i+1)*len(r)/n]))
	}
	return pieces
}
