//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

// goRequestTimeout bounds one request of the Go SDK.
const goRequestTimeout = 60 * time.Second

// userTurns are the user messages of a conversation, the same as the node
// drivers' (testdata/clients/fake.mjs).
var userTurns = []string{
	"What directory am I in?",
	"Now list the files there.",
	"Thanks. Summarise what you found in one line.",
}

// newGoClient returns a Go SDK client for the OpenAI base URL baseURL
// (…/v1), without retries.
func newGoClient(baseURL string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(baseURL+"/"),
		option.WithAPIKey("fake-key"),
		option.WithMaxRetries(0),
		option.WithRequestTimeout(goRequestTimeout),
	)
}

// goConversation is a conversation the Go SDK holds like the node drivers
// do: every request carries the whole history, without
// previous_response_id; each user message is a tool loop.
type goConversation struct {
	client  openai.Client
	session string // the x-session-id header
	store   bool
	stream  bool // Responses.NewStreaming, else Responses.New
	history responses.ResponseInputParam
	// latencies are the durations of the requests, in order: until the
	// response, or until the stream's last event.
	latencies []time.Duration
}

// params returns the request for the history so far.
func (c *goConversation) params() responses.ResponseNewParams {
	tool := responses.ToolParamOfFunction("run_command", map[string]any{
		"type": "object",
		"properties": map[string]any{
			"command": map[string]any{"type": "string", "description": "The command line to run."},
		},
		"required":             []string{"command"},
		"additionalProperties": false,
	}, true)
	tool.OfFunction.Description = openai.String("Run a shell command and return its output.")
	return responses.ResponseNewParams{
		Model:        "gpt-5.1",
		Instructions: openai.String("You are a terse assistant. Use run_command to inspect the machine before answering."),
		Input:        responses.ResponseNewParamsInputUnion{OfInputItemList: c.history},
		Tools:        []responses.ToolUnionParam{tool},
		Store:        openai.Bool(c.store),
		Include:      []responses.ResponseIncludable{responses.ResponseIncludableReasoningEncryptedContent},
		Reasoning:    shared.ReasoningParam{Effort: shared.ReasoningEffortLow, Summary: shared.ReasoningSummaryAuto},
	}
}

// userTurn sends a user message and runs the tool loop until the model
// answers with a message, whose text it returns.
func (c *goConversation) userTurn(ctx context.Context, text string) (string, error) {
	c.history = append(c.history, responses.ResponseInputItemParamOfMessage(text, responses.EasyInputMessageRoleUser))
	for range 10 {
		output, err := c.respond(ctx)
		if err != nil {
			return "", fmt.Errorf("%s: request %d: %w", c.session, len(c.latencies), err)
		}
		var calls []responses.ResponseFunctionToolCall
		var said string
		for _, item := range output {
			in, err := inputOf(item)
			if err != nil {
				return "", fmt.Errorf("%s: %w", c.session, err)
			}
			c.history = append(c.history, in)
			switch item.Type {
			case "function_call":
				calls = append(calls, item.AsFunctionCall())
			case "message":
				for _, part := range item.AsMessage().Content {
					said += part.Text
				}
			}
		}
		if len(calls) == 0 {
			if said == "" {
				return "", fmt.Errorf("%s: an answer with neither a function call nor a message", c.session)
			}
			return said, nil
		}
		for _, call := range calls {
			var args struct {
				Command string `json:"command"`
			}
			if err := json.Unmarshal([]byte(call.Arguments), &args); err != nil {
				return "", fmt.Errorf("%s: arguments of %s: %w", c.session, call.Name, err)
			}
			out := responses.ResponseInputItemParamOfFunctionCallOutput(runCommand(args.Command))
			out.OfFunctionCallOutput.CallID = openai.String(call.CallID)
			c.history = append(c.history, out)
		}
	}
	return "", fmt.Errorf("%s: the tool loop did not end", c.session)
}

// respond sends the history and returns the output items.
func (c *goConversation) respond(ctx context.Context) ([]responses.ResponseOutputItemUnion, error) {
	header := option.WithHeader("x-session-id", c.session)
	start := time.Now()
	defer func() { c.latencies = append(c.latencies, time.Since(start)) }()
	if !c.stream {
		resp, err := c.client.Responses.New(ctx, c.params(), header)
		if err != nil {
			return nil, err
		}
		return resp.Output, nil
	}
	stream := c.client.Responses.NewStreaming(ctx, c.params(), header)
	defer stream.Close()
	var output []responses.ResponseOutputItemUnion
	completed := false
	for stream.Next() {
		switch ev := stream.Current(); ev.Type {
		case "response.output_item.done":
			output = append(output, ev.AsResponseOutputItemDone().Item)
		case "response.completed":
			completed = true
		case "error", "response.failed", "response.incomplete":
			return nil, fmt.Errorf("streamed %s: %s", ev.Type, ev.RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	if !completed {
		return nil, errors.New("the stream ended without response.completed")
	}
	return output, nil
}

// inputOf returns an output item as the input item that sends it back.
func inputOf(item responses.ResponseOutputItemUnion) (responses.ResponseInputItemUnionParam, error) {
	switch item.Type {
	case "message":
		m := item.AsMessage().ToParam()
		return responses.ResponseInputItemUnionParam{OfOutputMessage: &m}, nil
	case "function_call":
		f := item.AsFunctionCall().ToParam()
		return responses.ResponseInputItemUnionParam{OfFunctionCall: &f}, nil
	case "reasoning":
		r := item.AsReasoning().ToParam()
		return responses.ResponseInputItemUnionParam{OfReasoning: &r}, nil
	}
	return responses.ResponseInputItemUnionParam{}, fmt.Errorf("unexpected output item %s", item.RawJSON())
}

// runCommand pretends to run a command, as the node drivers do.
func runCommand(command string) string {
	outputs := map[string]string{"echo hello": "hello", "ls": "README.md\npackage.json", "pwd": "/work"}
	return "$ " + command + "\n" + outputs[command]
}
