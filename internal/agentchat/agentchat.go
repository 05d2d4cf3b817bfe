// Package agentchat writes the conversation of a coding agent, as the
// benchmarks of a gateway send it: many short items (user messages,
// function calls, their outputs and assistant messages) and one tool.
package agentchat

import "fmt"

// Text is filler for the items' texts.
const Text = "The build failed in the storage layer because the retry loop reads the " +
	"deadline before the lock is taken; moving the read inside the critical section " +
	"fixes the race, and the tests in the package pass again with the race detector on."

// Tools are the requests' tools, a JSON array.
const Tools = `[{"type":"function","name":"run_command","description":"Run a shell command in the workspace.",` +
	`"parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}]`

// History is a conversation of n items, in turns of four: a user message,
// a function call, its output and an assistant message, from about 150 to
// 450 bytes each.
func History(n int) [][]byte {
	items := make([][]byte, 0, n)
	for i := 0; len(items) < n; i++ {
		call := fmt.Sprintf("call_%024d", i)
		for _, it := range []string{
			fmt.Sprintf(`{"role":"user","content":%q}`, fmt.Sprintf("Step %d: %s", i, Text[:100])),
			fmt.Sprintf(`{"type":"function_call","id":"fc_%040d","call_id":%q,"name":"run_command","arguments":%q}`,
				i, call, fmt.Sprintf(`{"command":"go test ./store/... -run TestRetry%d -count=1"}`, i)),
			fmt.Sprintf(`{"type":"function_call_output","call_id":%q,"output":%q}`,
				call, fmt.Sprintf("--- FAIL: TestRetry%d (0.01s)\n    retry_test.go:%d: %s\nFAIL\nexit status 1", i, 40+i%100, Text)),
			fmt.Sprintf(`{"type":"message","id":"msg_%040d","role":"assistant","status":"completed",`+
				`"content":[{"type":"output_text","annotations":[],"text":%q}]}`, i, Text[:200]),
		} {
			if len(items) < n {
				items = append(items, []byte(it))
			}
		}
	}
	return items
}

// Body is a request body with the first n items of History as its input.
func Body(n int) []byte {
	body := fmt.Appendf(nil, `{"model":"gpt-5.1","store":true,"stream":false,"prompt_cache_key":"session-1",`+
		`"instructions":"You are a coding agent. Be terse.","tools":%s,"input":[`, Tools)
	for i, it := range History(n) {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, it...)
	}
	return append(body, "]}"...)
}
