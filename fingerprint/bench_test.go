package fingerprint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// syntheticWords mixes plain ASCII with characters that exercise escapes and
// multi-byte UTF-8.
var syntheticWords = []string{
	"the", "request", "weather", "forecast", "tomorrow", "Paris", "function", "result",
	"please", "summarise", "document", "section", "because", "however", "value", "table",
	"café", "naïve", "Zürich", "日本語", "données", "🚀", "Ελληνικά", "привет",
	"\"quoted\"", "back\\slash", "tab\there", "line\nbreak", "a/b", "<tag>", "x&y", "50%",
}

// syntheticText returns about n bytes of text.
func syntheticText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			if rng.IntN(12) == 0 {
				b.WriteString(".\n")
			} else {
				b.WriteByte(' ')
			}
		}
		b.WriteString(syntheticWords[rng.IntN(len(syntheticWords))])
	}
	return b.String()
}

// syntheticString returns s as a JSON string token, sometimes with \u
// escapes for non-ASCII characters.
func syntheticString(rng *rand.Rand, s string) string {
	tok, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	if rng.IntN(8) != 0 {
		return string(tok)
	}
	var b strings.Builder
	for _, r := range string(tok) {
		switch {
		case r > 0xffff:
			r -= 0x10000
			fmt.Fprintf(&b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		case r >= 0x80:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func syntheticID(rng *rand.Rand, prefix string) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := []byte(prefix)
	for i := 0; i < 24; i++ {
		b = append(b, alphabet[rng.IntN(len(alphabet))])
	}
	return string(b)
}

func syntheticArguments(rng *rand.Rand, size int) string {
	var b strings.Builder
	b.WriteString(`{"location": `)
	b.WriteString(syntheticString(rng, syntheticText(rng, 12)))
	b.WriteString(`, "units":"celsius", "days": `)
	b.WriteString(strconv.Itoa(rng.IntN(14) + 1))
	b.WriteString(`, "include": ["hourly", "alerts"], "query": `)
	b.WriteString(syntheticString(rng, syntheticText(rng, size)))
	b.WriteString(`, "options": {"precision": 0.5, "strict": true, "fallback": null}}`)
	return b.String()
}

const syntheticTools = `[
    {"type": "function", "name": "get_weather", "description": "Get the weather forecast for a location.",
     "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City and country, e.g. Paris, France"},
       "units": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
       "include": {"type": "array", "items": {"type": "string"}}, "query": {"type": "string"},
       "options": {"type": "object", "properties": {"precision": {"type": "number"}, "strict": {"type": "boolean"}}, "additionalProperties": true}},
     "required": ["location"], "additionalProperties": false}, "strict": false},
    {"type": "function", "name": "search_documents", "description": "Full-text search over the user's documents.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 10}},
     "required": ["query", "limit"], "additionalProperties": false}, "strict": true},
    {"type": "web_search_preview", "search_context_size": "medium"}
  ]`

// syntheticBody returns a deterministic Responses-style request body with the
// given number of input items and roughly approxBytes bytes: user and
// assistant messages with content parts, function calls with JSON arguments,
// function call outputs and reasoning items, plus the usual top-level fields.
func syntheticBody(items int, approxBytes int) []byte {
	rng := rand.New(rand.NewPCG(uint64(items), uint64(approxBytes)))
	per := (approxBytes - 4500) / max(items, 1)
	text := func(frac int) int { return max(8, (per-120)*frac/86) }
	var b bytes.Buffer
	b.WriteString("{\n  \"model\": \"gpt-4.1\",\n  \"instructions\": ")
	b.WriteString(syntheticString(rng, syntheticText(rng, 2000)))
	b.WriteString(",\n  \"tools\": ")
	b.WriteString(syntheticTools)
	b.WriteString(",\n  \"tool_choice\": \"auto\",\n  \"parallel_tool_calls\": true,\n  \"store\": false,\n  \"stream\": true,\n")
	b.WriteString("  \"temperature\": 0.7,\n  \"max_output_tokens\": 4096,\n  \"text\": {\"format\": {\"type\": \"text\"}, \"verbosity\": \"medium\"},\n")
	b.WriteString("  \"reasoning\": {\"effort\": \"medium\", \"summary\": \"auto\"},\n  \"metadata\": {\"session\": \"")
	b.WriteString(syntheticID(rng, "sess_"))
	b.WriteString("\"},\n  \"input\": [")
	call := ""
	for i := 0; i < items; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("\n    ")
		kind := i % 6
		if call != "" {
			kind = 6
		}
		switch kind {
		case 0, 3: // user message
			b.WriteString(`{"type": "message", "role": "user", "content": [`)
			parts := 1 + rng.IntN(3)
			for j := 0; j < parts; j++ {
				if j > 0 {
					b.WriteString(", ")
				}
				b.WriteString(`{"type": "input_text", "text": `)
				b.WriteString(syntheticString(rng, syntheticText(rng, text(80/parts))))
				b.WriteByte('}')
			}
			b.WriteString("]}")
		case 1: // reasoning
			b.WriteString(`{"type":"reasoning","id":"`)
			b.WriteString(syntheticID(rng, "rs_"))
			b.WriteString(`","summary":[{"type":"summary_text","text":`)
			b.WriteString(syntheticString(rng, syntheticText(rng, text(40))))
			b.WriteString(`}],"encrypted_content":"`)
			enc := make([]byte, text(50))
			const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
			for k := range enc {
				enc[k] = b64[rng.IntN(64)]
			}
			b.Write(enc)
			b.WriteString(`"}`)
		case 2, 5: // assistant message
			b.WriteString(`{"id": "`)
			b.WriteString(syntheticID(rng, "msg_"))
			b.WriteString(`", "type": "message", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": `)
			b.WriteString(syntheticString(rng, syntheticText(rng, text(90))))
			b.WriteString("}]}")
		case 4: // function call
			call = syntheticID(rng, "call_")
			args, _ := json.Marshal(syntheticArguments(rng, text(40)))
			if rng.IntN(2) == 0 {
				b.WriteString(`{"type": "function_call", "id": "`)
				b.WriteString(syntheticID(rng, "fc_"))
				b.WriteString(`", "call_id": "`)
				b.WriteString(call)
				b.WriteString(`", "name": "get_weather", "arguments": `)
				b.Write(args)
				b.WriteString(`, "status": "completed"}`)
			} else {
				b.WriteString(`{"arguments":`)
				b.Write(args)
				b.WriteString(`,"call_id":"`)
				b.WriteString(call)
				b.WriteString(`","name":"search_documents","type":"function_call"}`)
			}
		case 6: // function call output
			b.WriteString(`{"type": "function_call_output", "call_id": "`)
			b.WriteString(call)
			b.WriteString(`", "output": `)
			out, _ := json.Marshal(`{"temperature": 21.5, "conditions": ` + syntheticString(rng, syntheticText(rng, text(60))) + `}`)
			b.Write(out)
			b.WriteString("}")
			call = ""
		}
	}
	b.WriteString("\n  ]\n}\n")
	return b.Bytes()
}

// BenchmarkParseRequest parses a request body whose items are new to the
// parser (items=N/new: the parser's item cache, full of other items, is
// given a new key before each parse, and its run cache is new, as for a
// conversation's first request) and one whose items it has all seen
// before, item by item (items=N/seen: without a run cache, every item
// found in the item cache; BenchmarkParseSeen has the run cache).
func BenchmarkParseRequest(b *testing.B) {
	for _, size := range []struct {
		name  string
		items int
		bytes int
	}{
		{"items=500/1MB", 500, 1 << 20},
		{"items=100/200KB", 100, 200 << 10},
	} {
		body := syntheticBody(size.items, size.bytes)
		for _, seen := range []bool{false, true} {
			name := size.name + "/new"
			if seen {
				name = size.name + "/seen"
			}
			b.Run(name, func(b *testing.B) {
				p := *testParser
				p.items, p.runs = newItemCache(), nil
				if _, err := p.Parse(body); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if !seen {
						p.items.rekey()
						p.runs = newRunCache()
					}
					r, err := p.Parse(body)
					if err != nil {
						b.Fatal(err)
					}
					if r.Len() != size.items {
						b.Fatalf("Len() = %d, want %d", r.Len(), size.items)
					}
				}
			})
		}
	}
}

func BenchmarkTranscript(b *testing.B) {
	body := syntheticBody(500, 1<<20)
	r, err := testParser.Parse(body)
	if err != nil {
		b.Fatal(err)
	}
	prev, err := testParser.Parse([]byte(`{"input":[]}`))
	if err != nil {
		b.Fatal(err)
	}
	output := r.Items()
	b.SetBytes(r.bytes)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := prev.Transcript(output); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCanonical(b *testing.B) {
	body := syntheticBody(500, 1<<20)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := canonicalExact(body); err != nil {
			b.Fatal(err)
		}
	}
}
