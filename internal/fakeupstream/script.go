package fakeupstream

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Script is the fake model. It decides each answer from the tools a request
// offers and the conversation so far (the previous response's transcript,
// when the request continues one, followed by the request's input), so the
// same conversation always gets the same answer:
//
//	after a user message, while fewer than ToolCalls function_call_output
//	items follow it and the request offers a function tool:
//	    call that tool (a shell tool runs the next of Commands)
//	otherwise:
//	    answer with an assistant message
//
// Each answer starts with a reasoning item when the request asks for
// reasoning (a "reasoning" member, or "reasoning.encrypted_content" in
// include). The zero Script answers every user message with a message.
type Script struct {
	// ToolCalls is the number of function calls the model makes after each
	// user message before it answers with a message.
	ToolCalls int
	// Commands are the shell commands the model runs, in turn, when the tool
	// it calls takes a command (DefaultCommands when empty).
	Commands []string
	// Chunks is the number of deltas a streamed text or argument string is
	// cut into (3 when zero or less).
	Chunks int
}

// DefaultCommands are the harmless commands the model runs by default.
var DefaultCommands = []string{"echo hello", "ls", "pwd"}

// shellTools are the names of tools that run a command, preferred in this
// order over any other function tool (Codex offers exec_command or
// shell_command, older versions shell).
var shellTools = []string{"exec_command", "shell_command", "shell", "local_shell", "run_command"}

// Move is what the model does in one response.
type Move struct {
	// Reason is the reasoning summary text, when the move starts with a
	// reasoning item.
	Reason string
	// Call is the function call to make, or nil.
	Call *Call
	// Say is the assistant message to answer when Call is nil.
	Say string
}

// Call is a function call the model makes.
type Call struct {
	Name      string
	Arguments string // JSON text
}

// Conversation is what the script sees of a request.
type Conversation struct {
	// Items are the conversation's items, oldest first.
	Items []json.RawMessage
	// Tools are the request's function tools, in request order.
	Tools []FunctionTool
}

// FunctionTool is a function tool a request offers.
type FunctionTool struct {
	Name       string          `json:"name"`
	Parameters json.RawMessage `json:"parameters"`
}

// Next returns the model's move for c.
func (s Script) Next(c Conversation) Move {
	userTurns, calls, lastUser := progress(c.Items)
	tool, ok := pickTool(c.Tools)
	if ok && userTurns > 0 && calls < s.ToolCalls {
		command := s.command(userTurns, calls)
		return Move{
			Reason: fmt.Sprintf("Step %d of %d for user message %d: run %q with %s.",
				calls+1, s.ToolCalls, userTurns, command, tool.Name),
			Call: &Call{Name: tool.Name, Arguments: arguments(tool, command)},
		}
	}
	return Move{
		Reason: fmt.Sprintf("User message %d answered after %d tool calls; writing the reply.", userTurns, calls),
		Say: fmt.Sprintf("Done with message %d after %d tool calls (%d items seen). You said: %s",
			userTurns, calls, len(c.Items), clip(lastUser, 80)),
	}
}

func (s Script) command(userTurns, calls int) string {
	commands := s.Commands
	if len(commands) == 0 {
		commands = DefaultCommands
	}
	return commands[((userTurns-1)*s.ToolCalls+calls)%len(commands)]
}

func (s Script) chunks() int {
	if s.Chunks <= 0 {
		return 3
	}
	return s.Chunks
}

// progress counts the user messages of items, the function_call_output
// items after the last of them, and returns that message's text.
func progress(items []json.RawMessage) (userTurns, calls int, lastUser string) {
	for _, raw := range items {
		var it inputItem
		_ = json.Unmarshal(raw, &it) // parseInput checked every item
		switch {
		case it.isUserMessage():
			userTurns++
			calls = 0
			lastUser = messageText(raw)
		case it.kind() == "function_call_output":
			calls++
		}
	}
	return userTurns, calls, lastUser
}

// pickTool returns the shell tool the request offers, else its first
// function tool.
func pickTool(tools []FunctionTool) (FunctionTool, bool) {
	for _, name := range shellTools {
		if i := slices.IndexFunc(tools, func(t FunctionTool) bool { return t.Name == name }); i >= 0 {
			return tools[i], true
		}
	}
	if len(tools) > 0 {
		return tools[0], true
	}
	return FunctionTool{}, false
}

// arguments returns valid arguments for tool's JSON schema: its required
// properties, and any property that takes a command, filled with plain
// values; command holds the shell command to run.
func arguments(tool FunctionTool, command string) string {
	var schema map[string]any
	_ = json.Unmarshal(tool.Parameters, &schema) // absent or invalid: no arguments
	v := fill(schema, "", command)
	if _, ok := v.(map[string]any); !ok {
		v = map[string]any{}
	}
	return string(mustMarshal(v))
}

// commandNames are the property names that take the command to run.
var commandNames = []string{"cmd", "command", "script"}

func fill(schema map[string]any, name, command string) any {
	if enum, ok := schema["enum"].([]any); ok && len(enum) > 0 {
		return enum[0]
	}
	isCommand := slices.Contains(commandNames, strings.ToLower(name))
	switch schemaType(schema) {
	case "object":
		props, _ := schema["properties"].(map[string]any)
		required, _ := schema["required"].([]any)
		out := map[string]any{}
		for key, p := range props {
			sub, _ := p.(map[string]any)
			if slices.Contains(required, any(key)) || slices.Contains(commandNames, strings.ToLower(key)) {
				out[key] = fill(sub, key, command)
			}
		}
		return out
	case "array":
		items, _ := schema["items"].(map[string]any)
		if isCommand {
			return []any{"bash", "-lc", command}
		}
		return []any{fill(items, "", command)}
	case "integer", "number":
		if min, ok := schema["minimum"].(float64); ok {
			return min
		}
		return 1
	case "boolean":
		return false
	case "null":
		return nil
	default: // string, or no type
		if isCommand {
			return command
		}
		return "hello"
	}
}

// schemaType is a schema's type, the first non-null one when it lists
// several, "object" when it has properties but no type.
func schemaType(schema map[string]any) string {
	switch t := schema["type"].(type) {
	case string:
		return t
	case []any:
		for _, v := range t {
			if s, ok := v.(string); ok && s != "null" {
				return s
			}
		}
	}
	if _, ok := schema["properties"]; ok {
		return "object"
	}
	return ""
}

// messageText is the text of a message item: its content string, or its
// text parts joined.
func messageText(raw json.RawMessage) string {
	var msg struct {
		Content json.RawMessage `json:"content"`
	}
	_ = json.Unmarshal(raw, &msg)
	var s string
	if json.Unmarshal(msg.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(msg.Content, &parts)
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		texts = append(texts, p.Text)
	}
	return strings.Join(texts, "")
}

func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
