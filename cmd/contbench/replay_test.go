package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/proxy"
	"github.com/contstore/contstore/store"
)

// minContinued is the fraction of later turns a real client's trace must
// continue.
const minContinued = 0.95

// Items and bodies of hand-written traces.
func traceUser(text string) any {
	return map[string]any{"type": "message", "role": "user", "content": text}
}

func traceAnswer(text string) any {
	return map[string]any{"type": "message", "role": "assistant",
		"content": []any{map[string]any{"type": "output_text", "text": text}}}
}

func traceBody(instructions string, input ...any) any {
	return map[string]any{"model": "m", "instructions": instructions, "input": input}
}

// line returns one trace line; request is marshalled unless it is a
// json.RawMessage already.
func traceLineOf(t *testing.T, session, agent string, request any, responseID string, output ...any) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"owner":   map[string]string{"session": session, "agent": agent},
		"headers": map[string]string{"session-id": session},
		"request": request, "response_id": responseID, "output": output,
		"unknown": "ignored",
	})
	require.NoError(t, err)
	return string(b) + "\n"
}

// replayTrace replays trace, named name, through a fresh in-process store
// and returns the report and the printed turns.
func replayTrace(t *testing.T, name, trace string) (*replayReport, string) {
	t.Helper()
	s, err := store.NewMemory(store.Options{})
	require.NoError(t, err)
	var out bytes.Buffer
	r := newReplayer(s, "in-process store", &out)
	require.NoError(t, r.replay(context.Background(), name, strings.NewReader(trace)))
	return &r.report, out.String()
}

// handTrace is a conversation with one turn of each kind; turns[i] is the
// i-th turn's line number (malformed lines make no turn).
func handTrace(t *testing.T) string {
	u1, u2, u3, u4, u5 := traceUser("hi"), traceUser("and then?"), traceUser("more"), traceUser("again"), traceUser("last")
	a1, a2, a3, a4 := traceAnswer("hello"), traceAnswer("then this"), traceAnswer("more of it"), traceAnswer("once more")
	edited := map[string]any{"type": "message", "role": "developer", "content": "edited"}
	return traceLineOf(t, "s1", "", traceBody("be brief", u1), "resp_1", a1) + // 1: first turn
		traceLineOf(t, "s1", "", traceBody("be brief", u1, a1, u2), "resp_2", a2) + // 2: continued
		traceLineOf(t, "s1", "helper", traceBody("be brief", u1), "resp_h", a1) + // 3: an agent's first turn
		"\n" + // 4: blank, skipped
		traceLineOf(t, "s1", "", traceBody("be verbose", u1, a1, u2, a2, u3), "resp_3", a3) + // 5: another prompt, a thread of its own
		traceLineOf(t, "s1", "", traceBody("be verbose", u1, a1, edited, a2, u3, a3, u4), "resp_4", a4) + // 6: not_append_only
		traceLineOf(t, "s1", "", json.RawMessage(`{"model":"m","input":null}`), "resp_x") + // 7: invalid request
		`{"owner":{"session":"s1"},"request":` + "\n" + // 8: malformed JSON
		`{"owner":{"session":"s1","agent":"a\u0007"},"request":{"input":[]}}` + "\n" + // 9: an invalid agent id
		traceLineOf(t, "s1", "", traceBody("be verbose", u1, a1, edited, a2, u3, a3, u4, a4, u5), "resp_5", traceAnswer("done")) + // 10: continued
		traceLineOf(t, "s1", "helper", traceBody("be verbose", u1, a1, u2), "resp_h2", a2) // 11: the agent's prompt_changed
}

func TestReplayHandTrace(t *testing.T) {
	rep, out := replayTrace(t, "hand.jsonl", handTrace(t))
	t.Log(out)
	require.Len(t, rep.Turn, 8)
	byLine := map[int]*replayTurn{}
	for _, turn := range rep.Turn {
		byLine[turn.Line] = turn
	}

	first := byLine[1]
	assert.Equal(t, "missing_state", first.Reason)
	assert.False(t, first.Later)
	assert.Nil(t, first.Mismatch, "an owner's first turn is not a miss to explain")
	assert.Empty(t, first.Difference)

	cont := byLine[2]
	assert.Equal(t, reasonContinued, cont.Reason)
	assert.True(t, cont.Later)
	assert.Equal(t, "resp_1", cont.PreviousResponseID)
	assert.Equal(t, 1, cont.ItemsSent)
	assert.Equal(t, 3, cont.ItemsFull)
	assert.Less(t, cont.BytesSent, cont.BytesFull)
	assert.Equal(t, string(store.OutcomePublished), cont.Outcome)
	assert.Contains(t, out, "hand.jsonl:2  main(\"s1\")  continued  items 1 of 3")

	agent := byLine[3]
	assert.Equal(t, "missing_state", agent.Reason)
	assert.False(t, agent.Later, "siblings do not share turns")
	assert.Equal(t, identityOwner{"s1", "helper"}, agent.Owner)

	thread := byLine[5]
	assert.Equal(t, string(store.ReasonMissingState), thread.Reason, "a main thread's prompt names its owner")
	assert.False(t, thread.Later)

	prompt := byLine[11]
	assert.Equal(t, string(store.ReasonPromptChanged), prompt.Reason, "a sub-agent keeps its owner")
	require.NotNil(t, prompt.Mismatch)
	assert.Equal(t, []string{"instructions"}, prompt.Mismatch.Prompt)
	assert.Equal(t, -1, prompt.Mismatch.Item)
	assert.Equal(t, prompt.ItemsFull, prompt.ItemsSent, "a miss sends the full input")
	assert.Equal(t, prompt.BytesFull, prompt.BytesSent)
	assert.Contains(t, out, "prompt members differ: instructions")

	edit := byLine[6]
	assert.Equal(t, string(store.ReasonNotAppendOnly), edit.Reason)
	require.NotNil(t, edit.Mismatch)
	assert.Empty(t, edit.Mismatch.Prompt)
	assert.Equal(t, 2, edit.Mismatch.Item)
	assert.Equal(t, []string{"content", "role"}, edit.Mismatch.Members)
	assert.Contains(t, out, "item 2 differs in members: content, role")

	invalid := byLine[7]
	assert.Equal(t, reasonInvalidRequest, invalid.Reason)
	assert.Contains(t, invalid.Error, "invalid request")
	assert.Positive(t, invalid.BytesFull)
	assert.Equal(t, invalid.BytesFull, invalid.BytesSent, "what the store cannot parse goes upstream as it came")

	// Malformed lines are reported with their numbers and skipped.
	require.Len(t, rep.MalformedLines, 2)
	assert.Equal(t, 8, rep.MalformedLines[0].Line)
	assert.Equal(t, 9, rep.MalformedLines[1].Line)
	assert.Contains(t, rep.MalformedLines[1].Error, "agent id")
	assert.Contains(t, out, "hand.jsonl:8: malformed trace line, skipped")
	assert.Equal(t, 2, rep.Malformed)

	// The replay goes on: the last turn continues the one before the
	// invalid request.
	last := byLine[10]
	assert.Equal(t, reasonContinued, last.Reason)
	assert.Equal(t, "resp_4", last.PreviousResponseID)

	assert.Equal(t, 8, rep.Turns)
	assert.Equal(t, 4, rep.LaterTurns)
	assert.Equal(t, 2, rep.Continued)
	assert.Equal(t, map[string]int{"continued": 2, "missing_state": 3, "prompt_changed": 1,
		"not_append_only": 1, "invalid_request": 1}, rep.Reasons)
	require.Len(t, rep.Files, 1)
	assert.Equal(t, rep.replayTotals, rep.Files[0].replayTotals)
}

func TestReplayExplainsALaterMissWithoutDifference(t *testing.T) {
	u1, a1 := traceUser("hi"), traceAnswer("hello")
	trace := traceLineOf(t, "s1", "", traceBody("x", u1), "", a1) + // no response id: nothing to continue
		traceLineOf(t, "s1", "", traceBody("x", u1, a1, traceUser("next")), "resp_2", a1) +
		traceLineOf(t, "s1", "", traceBody("x", u1, a1, traceUser("next"), a1), "resp_3", a1) // repeats the transcript
	rep, _ := replayTrace(t, "t.jsonl", trace)
	require.Len(t, rep.Turn, 3)
	assert.Equal(t, string(store.OutcomeDropped), rep.Turn[0].Outcome)
	assert.Equal(t, "missing_state", rep.Turn[1].Reason)
	assert.Contains(t, rep.Turn[1].Difference, "extends the previous transcript (2 of 3 items)")
	assert.Equal(t, "empty_delta", rep.Turn[2].Reason)
	assert.Contains(t, rep.Turn[2].Difference, "repeats the previous transcript (4 items)")
}

func TestReplayFilesAreIndependent(t *testing.T) {
	s, err := store.NewMemory(store.Options{})
	require.NoError(t, err)
	r := newReplayer(s, "in-process store", &bytes.Buffer{})
	trace := traceLineOf(t, "s1", "", traceBody("x", traceUser("hi")), "resp_1", traceAnswer("hello")) +
		traceLineOf(t, "s1", "", traceBody("x", traceUser("hi"), traceAnswer("hello"), traceUser("more")), "resp_2", traceAnswer("ok"))
	for _, name := range []string{"a.jsonl", "b.jsonl"} {
		require.NoError(t, r.replay(context.Background(), name, strings.NewReader(trace)))
	}
	require.Len(t, r.report.Files, 2)
	assert.Equal(t, r.report.Files[0].replayTotals, r.report.Files[1].replayTotals,
		"an owner's first line in a file starts from no state")
	assert.Equal(t, 2, r.report.LaterTurns)
}

func TestReplayJSONKeys(t *testing.T) {
	rep, _ := replayTrace(t, "hand.jsonl", handTrace(t))
	path := filepath.Join(t.TempDir(), "r.json")
	require.NoError(t, writeJSON(path, rep))
	data, err := os.ReadFile(path)
	require.NoError(t, err)

	var top map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(data, &top))
	for _, k := range []string{"turns", "later_turns", "continued", "items_sent", "items_full",
		"bytes_sent", "bytes_full", "reasons", "turn", "files"} {
		assert.Contains(t, top, k)
	}
	var totals struct {
		Turns, LaterTurns, Continued int
		Reasons                      map[string]int
		Turn                         []map[string]json.RawMessage
	}
	require.NoError(t, json.Unmarshal(data, &totals))
	assert.Equal(t, 8, totals.Turns)
	assert.Equal(t, 1, totals.Reasons["not_append_only"])
	require.Len(t, totals.Turn, 8)

	edit := totals.Turn[4] // line 6
	keys := make([]string, 0, len(edit))
	for k := range edit {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	assert.Equal(t, []string{"bytes_full", "bytes_sent", "difference", "file", "items_full", "items_sent",
		"later", "line", "mismatch", "outcome", "owner", "reason"}, keys)
	assert.JSONEq(t, `{"Prompt":null,"Item":2,"Members":["content","role"]}`, string(edit["mismatch"]))
	assert.JSONEq(t, `{"session":"s1","agent":""}`, string(edit["owner"]))
}

// TestRealClientTracesContinue replays every captured client trace: each
// client's later turns must continue, or the failure names the misses and
// where each request departs from its previous turn.
func TestRealClientTracesContinue(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("..", "..", "testdata", "clients", "*.jsonl"))
	require.NoError(t, err)
	require.NotEmpty(t, paths, "no traces in testdata/clients")
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			requireMostContinue(t, path, func(r *replayer) error { return r.replayPath(context.Background(), path) })
		})
	}
}

// writeTrace writes trace to a temporary file and returns its path.
func writeTrace(t *testing.T, trace string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(trace), 0o644))
	return path
}

// replayCommand runs contbench replay with args.
func replayCommand(args ...string) (code int, stdout, stderr string) {
	var out, errs bytes.Buffer
	code = run(context.Background(), append([]string{"replay"}, args...), &out, &errs)
	return code, out.String(), errs.String()
}

func TestReplayCommandWritesJSON(t *testing.T) {
	trace := writeTrace(t, traceLineOf(t, "s1", "", traceBody("x", traceUser("hi")), "resp_1", traceAnswer("hello"))+
		traceLineOf(t, "s1", "", traceBody("x", traceUser("hi"), traceAnswer("hello"), traceUser("more")), "resp_2", traceAnswer("ok")))
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := replayCommand("-json", jsonPath, trace)
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "contbench replay: in-process store, 1 trace file\n")
	assert.Contains(t, stdout, trace+":2  main(\"s1\")  continued  items 1 of 3")
	assert.Contains(t, stdout, "reasons: continued 1, missing_state 1")

	data, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep replayReport
	require.NoError(t, json.Unmarshal(data, &rep))
	assert.Equal(t, "in-process store", rep.Target)
	assert.Equal(t, 2, rep.Turns)
	assert.Equal(t, 1, rep.LaterTurns)
	assert.Equal(t, 1, rep.Continued)
	assert.Equal(t, 2, rep.ItemsSent)
	assert.Equal(t, 4, rep.ItemsFull)
	assert.Less(t, rep.BytesSent, rep.BytesFull)
	require.Len(t, rep.Files, 1)
	assert.Equal(t, trace, rep.Files[0].File)
}

func TestReplayCommandMalformedLineExitsOne(t *testing.T) {
	trace := writeTrace(t, "not json\n"+traceLineOf(t, "s1", "", traceBody("x", traceUser("hi")), "resp_1", traceAnswer("hello")))
	code, stdout, stderr := replayCommand(trace)
	assert.Equal(t, exitBadTrace, code)
	assert.Contains(t, stdout, trace+":1: malformed trace line, skipped")
	assert.Contains(t, stdout, trace+":2  main(\"s1\")  missing_state", "the replay goes on")
	assert.Contains(t, stderr, "1 malformed trace line was skipped")
}

func TestReplayCommandFlags(t *testing.T) {
	code, stdout, stderr := replayCommand("-h")
	assert.Equal(t, exitOK, code)
	assert.Empty(t, stdout)
	for _, f := range []string{"-json", "-redis", "-cluster", "TRACE.jsonl"} {
		assert.Contains(t, stderr, f)
	}
	_, _, mainHelp := func() (int, string, string) {
		var out, errs bytes.Buffer
		return run(context.Background(), []string{"-h"}, &out, &errs), out.String(), errs.String()
	}()
	assert.Contains(t, mainHelp, "contbench replay", "contbench -h mentions the subcommand")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no trace files given"},
		{[]string{"-redis", "redis://127.0.0.1:1", "-cluster", "127.0.0.1:2", "t.jsonl"}, "-cluster"},
		{[]string{"-redis", "http://x", "t.jsonl"}, "-redis"},
		{[]string{"-cluster", "nohost", "t.jsonl"}, "-cluster"},
		{[]string{"-no-such-flag", "t.jsonl"}, "-no-such-flag"},
		{[]string{filepath.Join(t.TempDir(), "missing.jsonl")}, "missing.jsonl"},
	} {
		code, stdout, stderr := replayCommand(tc.args...)
		assert.Equal(t, exitUsage, code, "%v", tc.args)
		assert.Contains(t, stderr, tc.want, "%v", tc.args)
		assert.Empty(t, stdout, "%v", tc.args)
		assert.NotContains(t, stderr, "Usage:", "%v: a bad flag is one line, not the help", tc.args)
	}
	_, _, stderr = replayCommand("-no-such-flag", "t.jsonl")
	assert.Equal(t, "contbench: flag provided but not defined: -no-such-flag\nrun contbench replay -h for the flags\n", stderr)
}

func TestReplayCommandOnRedis(t *testing.T) {
	mr, _ := redistest.Miniredis(t)
	trace := writeTrace(t, handTrace(t))
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := replayCommand("-json", jsonPath, "-redis", "redis://"+mr.Addr(), "-op-timeout", testOpTimeout, trace)
	require.Equal(t, exitBadTrace, code, stderr)
	assert.Contains(t, stdout, "contbench replay: redis redis://"+mr.Addr())
	assert.Empty(t, mr.Keys(), "the namespace is removed after the replay")

	data, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep replayReport
	require.NoError(t, json.Unmarshal(data, &rep))
	memory, _ := replayTrace(t, trace, handTrace(t))
	assert.Equal(t, memory.replayTotals, rep.replayTotals, "Redis decides as the in-process store does")
}

// An empty trace is no replay: it is refused before anything runs, as a
// missing one is.
func TestReplayEmptyFileIsAnError(t *testing.T) {
	for _, content := range []string{"", "\n \n\t\r\n"} {
		trace := writeTrace(t, content)
		code, stdout, stderr := replayCommand(trace)
		assert.Equal(t, exitUsage, code)
		assert.Equal(t, "contbench: no turns in "+trace+": the file is empty\n", stderr)
		assert.Empty(t, stdout, "no table of zeros")
	}
}

// A trace whose every line is malformed has no turns, and says so.
func TestReplayFileWithoutTurnsIsAnError(t *testing.T) {
	good := writeTrace(t, traceLineOf(t, "s1", "", traceBody("x", traceUser("hi")), "resp_1", traceAnswer("hello")))
	noise := filepath.Join(t.TempDir(), "noise.jsonl")
	require.NoError(t, os.WriteFile(noise, []byte("not json\n"), 0o644))
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := replayCommand("-json", jsonPath, good, noise)
	assert.Equal(t, exitBadTrace, code)
	assert.Contains(t, stdout, "contbench replay: in-process store, 2 trace files\n")
	assert.Contains(t, stdout, noise+": no turns in the file\n")
	assert.NotContains(t, stdout, good+": no turns")
	assert.Contains(t, stderr, "contbench: no turns in "+noise+"\n")

	data, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep replayReport
	require.NoError(t, json.Unmarshal(data, &rep))
	assert.Equal(t, []string{noise}, rep.FilesWithoutTurns)
	assert.Equal(t, 1, rep.Turns)
}

// A line without a request is no trace line: it is malformed, not a turn
// whose request the store refuses.
func TestReplayLineWithoutRequestIsMalformed(t *testing.T) {
	first := traceLineOf(t, "s1", "", traceBody("x", traceUser("hi")), "resp_1", traceAnswer("hello"))
	for _, line := range []string{
		`{"owner":{"session":"s1"},"response_id":"resp_2"}`,
		`{"owner":{"session":"s1"},"request":null}`,
	} {
		rep, out := replayTrace(t, "t.jsonl", first+line+"\n")
		assert.Equal(t, 1, rep.Turns, "the line is no turn")
		assert.Zero(t, rep.Reasons[reasonInvalidRequest])
		assert.Equal(t, 1, rep.Malformed)
		require.Len(t, rep.MalformedLines, 1)
		assert.Equal(t, 2, rep.MalformedLines[0].Line)
		assert.Equal(t, `no "request"`, rep.MalformedLines[0].Error)
		assert.Contains(t, out, "t.jsonl:2: malformed trace line, skipped: no \"request\"\n")
		assert.NotContains(t, out, "not a JSON object")
	}
}

// A line that does not decode is described in the trace's terms, not in
// Go's.
func TestReplayMalformedLinesSayWhatIsWrong(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`[1, 2]`, "not a JSON object but an array"},
		{`"text"`, "not a JSON object but a string"},
		{`42`, "not a JSON object but a number"},
		{`{"owner":"s1","request":{}}`, `"owner" is a string, want an object`},
		{`{"owner":{"session":5},"request":{}}`, `"owner.session" is a number, want a string`},
		{`{"owner":{"session":"s1"},"request":{},"output":{}}`, `"output" is an object, want an array`},
		{`not json`, "not JSON: invalid character 'o' in literal null (expecting 'u'), at byte 2"},
	} {
		rep, out := replayTrace(t, "t.jsonl", tc.line+"\n")
		require.Len(t, rep.MalformedLines, 1, tc.line)
		assert.Equal(t, tc.want, rep.MalformedLines[0].Error, tc.line)
		for _, goTerm := range []string{"main.", "Go value", "Go struct", "unmarshal"} {
			assert.NotContains(t, out, goTerm, tc.line)
		}
	}
}

// Noise makes a few lines of report, not one per line: the first
// malformed lines of a file are described, the others counted.
func TestReplayCapsMalformedLineMessages(t *testing.T) {
	var noise strings.Builder
	for noise.Len() < 64<<10 {
		noise.WriteString("\x00\x01binary noise \xff\xfe and more of it\n")
	}
	lines := strings.Count(noise.String(), "\n")
	trace := writeTrace(t, noise.String())
	code, stdout, stderr := replayCommand(trace)
	assert.Equal(t, exitBadTrace, code)
	assert.Equal(t, maxMalformedShown, strings.Count(stdout, "malformed trace line, skipped"))
	assert.Contains(t, stdout, fmt.Sprintf("%s: … and %d more malformed lines\n", trace, lines-maxMalformedShown))
	assert.Less(t, strings.Count(stdout, "\n"), 2*maxMalformedShown+10, stdout)
	assert.Contains(t, stderr, fmt.Sprintf("contbench: %d malformed trace lines were skipped", lines))
	assert.Contains(t, stdout, fmt.Sprintf("\nmalformed lines: %d, skipped", lines))

	rep, _ := replayTrace(t, trace, noise.String())
	assert.Equal(t, lines, rep.Malformed, "every malformed line is counted")
	assert.Len(t, rep.MalformedLines, maxMalformedShown)
}

// traceLineWithout returns a trace line without an owner, with headers.
func traceLineWithout(t *testing.T, headers map[string]any, request any, responseID string, output ...any) string {
	t.Helper()
	line := map[string]any{"request": request, "response_id": responseID, "output": output}
	if headers != nil {
		line["headers"] = headers
	}
	b, err := json.Marshal(line)
	require.NoError(t, err)
	return string(b) + "\n"
}

// A line that names no owner gets the one contproxy derives: from the
// credential, the prompt and the opening of the conversation.
func TestReplayDerivesTheOwnersOfLinesWithoutOne(t *testing.T) {
	u1, a1, u2, a2 := traceUser("hi"), traceAnswer("hello"), traceUser("more"), traceAnswer("ok")
	other := traceUser("another conversation")
	keyA := map[string]any{"authorization": "Bearer sk-a"}
	keyB := map[string]any{"authorization": []string{"Bearer sk-b"}}
	trace := traceLineWithout(t, keyA, traceBody("x", u1), "resp_1", a1) + // 1
		traceLineWithout(t, keyB, traceBody("x", u1), "resp_b", a1) + // 2: another credential, another owner
		traceLineWithout(t, keyA, traceBody("x", other), "resp_o", a1) + // 3: another opening, another owner
		traceLineWithout(t, keyA, traceBody("x", u1, a1, u2), "resp_2", a2) + // 4: continues line 1
		`{"owner":{"session":"","agent":""},"headers":{"authorization":"Bearer sk-a"},"request":` + // 5: an empty session: derived
		string(must(json.Marshal(traceBody("x", u1, a1, u2, a2, traceUser("last"))))) + `,"response_id":"resp_3"}` + "\n" +
		traceLineWithout(t, keyA, traceBody("x", traceAnswer("no user message")), "resp_n", a1) + // 6: no owner
		traceLineWithout(t, map[string]any{"session-id": ""}, traceBody("x", u1), "resp_e", a1) + // 7: an empty session id
		traceLineWithout(t, map[string]any{"x": 3}, traceBody("x", u1), "resp_e", a1) // 8: a header that is no string
	s, err := store.NewMemory(store.Options{})
	require.NoError(t, err)
	var out bytes.Buffer
	r := newReplayer(s, "in-process store", &out)
	require.NoError(t, r.replay(context.Background(), "derived.jsonl", strings.NewReader(trace)))
	t.Log(out.String())
	rep := &r.report
	byLine := map[int]*replayTurn{}
	for _, turn := range rep.Turn {
		byLine[turn.Line] = turn
	}
	require.Len(t, rep.Turn, 6)
	for _, n := range []int{1, 2, 3} {
		assert.Equal(t, "missing_state", byLine[n].Reason, "line %d", n)
		assert.False(t, byLine[n].Later, "line %d", n)
		assert.Len(t, byLine[n].Owner.Session, 16, "line %d", n)
	}
	assert.NotEqual(t, byLine[1].Owner, byLine[2].Owner)
	assert.NotEqual(t, byLine[1].Owner, byLine[3].Owner)
	for _, n := range []int{4, 5} {
		assert.Equal(t, reasonContinued, byLine[n].Reason, "line %d", n)
		assert.Equal(t, byLine[1].Owner, byLine[n].Owner, "line %d", n)
	}
	assert.Equal(t, "resp_2", byLine[5].PreviousResponseID)
	assert.Equal(t, string(store.ReasonMissingIdentity), byLine[6].Reason)
	assert.False(t, byLine[6].Later, "a request without owner is nobody's later turn")
	assert.Equal(t, identityOwner{}, byLine[6].Owner)
	assert.Equal(t, 2, rep.LaterTurns)
	require.Len(t, rep.MalformedLines, 2)
	assert.Contains(t, rep.MalformedLines[0].Error, "header session-id is empty")
	assert.Contains(t, rep.MalformedLines[1].Error, `header "x" is neither a string nor an array of strings`)

	// The owner is the one contproxy derives.
	req, err := s.ParseRequest(must(json.Marshal(traceBody("x", u1))))
	require.NoError(t, err)
	want, err := proxy.DefaultIdentity.Owner(http.Header{"Authorization": {"Bearer sk-a"}}, "", req)
	require.NoError(t, err)
	assert.Equal(t, identityOwner{want.Session(), ""}, byLine[1].Owner)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// stripIdentity returns a trace line without anything that names a
// session or an agent: no owner, none of proxy.DefaultIdentity's header
// or body sources (a request naming an agent but no session is refused).
// Everything else is kept byte for byte.
func stripIdentity(t *testing.T, raw []byte) []byte {
	t.Helper()
	var line map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &line))
	delete(line, "owner")
	if h, ok := line["headers"]; ok {
		var headers map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(h, &headers))
		for name := range headers {
			for _, src := range slices.Concat(proxy.DefaultIdentity.Session, proxy.DefaultIdentity.Agent) {
				if src.Header != "" && strings.EqualFold(name, src.Header) {
					delete(headers, name)
				}
			}
		}
		line["headers"] = must(json.Marshal(headers))
	}
	req := []byte(line["request"])
	for _, src := range slices.Concat(proxy.DefaultIdentity.Session, proxy.DefaultIdentity.Agent) {
		if src.Field != "" {
			var err error
			req, err = sjson.DeleteBytes(req, src.Field)
			require.NoError(t, err)
		}
	}
	line["request"] = req
	return must(json.Marshal(line))
}

// TestRealClientTracesContinueWithoutSessionIDs replays every captured
// client trace with its session and agent ids removed, as clients that
// name no session send it: the owners contproxy derives from the opening
// items must continue the later turns as the named sessions do.
func TestRealClientTracesContinueWithoutSessionIDs(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("..", "..", "testdata", "clients", "*.jsonl"))
	require.NoError(t, err)
	require.NotEmpty(t, paths, "no traces in testdata/clients")
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			var trace bytes.Buffer
			for _, raw := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
				stripped := stripIdentity(t, raw)
				var tl traceLine
				_, err := parseTraceLine(stripped, &tl)
				require.NoError(t, err)
				require.Nil(t, tl.Owner)
				h, err := tl.header()
				require.NoError(t, err)
				for _, src := range slices.Concat(proxy.DefaultIdentity.Session, proxy.DefaultIdentity.Agent) {
					require.Empty(t, h.Values(src.Header), "%s: %s is left", path, src)
					if src.Field != "" {
						require.False(t, gjson.GetBytes(tl.Request, src.Field).Exists(), "%s: %s is left", path, src)
					}
				}
				trace.Write(stripped)
				trace.WriteByte('\n')
			}
			requireMostContinue(t, path, func(r *replayer) error { return r.replay(context.Background(), path, &trace) })
		})
	}
}

// requireMostContinue replays one trace file with replay, on a fresh
// in-process store, and requires at least minContinued of its later turns
// continued, listing the misses otherwise.
func requireMostContinue(t *testing.T, path string, replay func(*replayer) error) {
	t.Helper()
	s, err := store.NewMemory(store.Options{})
	require.NoError(t, err)
	r := newReplayer(s, "in-process store", &bytes.Buffer{})
	require.NoError(t, replay(r))
	f := r.report.Files[0]
	require.Zero(t, f.Malformed, "%s: malformed lines: %+v", path, r.report.MalformedLines)
	require.Positive(t, f.LaterTurns, "%s has no later turns", path)
	t.Logf("%d of %d later turns continued; reasons: %s", f.Continued, f.LaterTurns, reasonsString(f.Reasons))
	if float64(f.Continued) >= minContinued*float64(f.LaterTurns) {
		return
	}
	var misses []string
	for _, turn := range r.report.Turn {
		if turn.Later && turn.Reason != reasonContinued {
			misses = append(misses, fmt.Sprintf("  line %d: %s: %s%s", turn.Line, turn.Reason, turn.Difference, turn.Error))
		}
	}
	t.Errorf("%s: %d of %d later turns continued, want at least %.0f%%\nreasons: %s\nmisses:\n%s",
		path, f.Continued, f.LaterTurns, 100*minContinued, reasonsString(f.Reasons), strings.Join(misses, "\n"))
}
