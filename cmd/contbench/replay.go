package main

// contbench replay: recorded client traffic through the store, turn by turn.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/proxy"
	"github.com/contstore/contstore/store"
)

// Exit status of a replay whose traces held malformed lines, or a file
// without turns.
const exitBadTrace = 1

// maxMalformedShown is how many malformed lines of a file the replay
// describes; it counts the others.
const maxMalformedShown = 10

// Reasons a replay reports besides the store's.
const (
	reasonContinued      = "continued"
	reasonInvalidRequest = "invalid_request"
)

// replayConfig is a parsed replay command line.
type replayConfig struct {
	// target says which store to replay against, as the main command's
	// -redis and -cluster flags do; the memory backend without them.
	target   *config
	jsonPath string
	files    []string
}

// parseReplayConfig parses the arguments of contbench replay.
func parseReplayConfig(args []string, stderr io.Writer) (*replayConfig, error) {
	rc := &replayConfig{target: &config{
		backend: backendMemory, client: clientGoRedis,
		// The store's defaults.
		partitions: 16, ttl: 30 * time.Minute, maxOwners: 10_000, maxTotalBytes: 20_000_000,
		namespace: freshNamespace(),
		// One replica, one worker: the fields the simulation would use.
		replicas: 1, conversations: 1, alike: 1, concurrency: 1, sockets: 1, turns: 1,
		upstream: anySocket, routing: roundRobin,
	}}
	var cluster string
	fs := flag.NewFlagSet("contbench replay", flag.ContinueOnError)
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: contbench replay [flags] TRACE.jsonl...\n\n"+
			"Replays recorded upstream calls through the store, in order, one line per call:\n"+
			"  {\"owner\":{\"session\":\"s1\",\"agent\":\"\"},\"request\":{...},\"response_id\":\"resp_1\",\"output\":[...]}\n"+
			"(other members are ignored). Each call is reserved and its response recorded\n"+
			"(socket any); every turn prints its decision, items and bytes sent, and every\n"+
			"miss after an owner's first turn prints where the request departs from the\n"+
			"previous turn's transcript. Each trace file is replayed on its own: an owner's\n"+
			"first line in a file starts from no state.\n\n"+
			"Every line gets the owner contproxy derives from its \"headers\" (names to\n"+
			"values) and its request, its \"owner\" standing for the session and agent\n"+
			"headers: scoped by the credential, the main thread by the prompt, and a\n"+
			"line naming no session by its opening items (without a user message it has\n"+
			"none: missing_identity).\n\n"+
			"A line that is not a trace line (bad JSON, no request, an invalid owner) is\n"+
			"skipped; the first %d of a file are reported with their numbers, the others\n"+
			"counted. The replay goes on and exits with status %d, as it does when a file\n"+
			"holds no turn. A request the store refuses is an invalid_request turn, sent\n"+
			"upstream in full.\n\n"+
			"Without -redis or -cluster the store is in process. On Redis every key lives in\n"+
			"a fresh namespace, removed at the end.\n\n"+
			"Exit status: %d, or %d when malformed lines were skipped or a file held no\n"+
			"turn, %d for bad flags, an unreadable or empty trace or a target that cannot\n"+
			"be used, %d when interrupted.\n\nFlags:\n",
			maxMalformedShown, exitBadTrace, exitOK, exitBadTrace, exitUsage, exitInterrupted)
		fs.PrintDefaults()
	}
	fs.StringVar(&rc.jsonPath, "json", "", "also write the report as JSON to `file`")
	fs.StringVar(&rc.target.redisURL, "redis", "", "replay against the standalone Redis at `URL`, e.g. redis://127.0.0.1:6379/0")
	fs.StringVar(&cluster, "cluster", "", "replay against the Redis Cluster with these seed `nodes`, host:port,host:port,...")
	fs.DurationVar(&rc.target.opTimeout, "op-timeout", 2*time.Second, "bound on each store operation")
	if err := parseFlags(fs, args, usage, stderr); err != nil {
		return nil, err
	}
	if cluster != "" {
		rc.target.cluster = strings.Split(cluster, ",")
	}
	if rc.target.redisURL != "" || len(rc.target.cluster) > 0 {
		rc.target.backend = "redis"
	}
	if err := rc.target.validate(); err != nil {
		return nil, err
	}
	if err := checkOutputPath(rc.jsonPath); err != nil {
		return nil, &usageError{"json", err.Error()}
	}
	rc.files = fs.Args()
	if len(rc.files) == 0 {
		return nil, &usageError{"", "replay: no trace files given"}
	}
	return rc, nil
}

// runReplay is contbench replay: it parses args, replays the traces and
// returns the exit status.
func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	rc, err := parseReplayConfig(args, stderr)
	if err != nil {
		return usageStatus(err, "contbench replay", stderr)
	}
	for _, path := range rc.files { // before anything runs: a typo costs nothing
		if err := checkTrace(path); err != nil {
			fmt.Fprintf(stderr, "contbench: %v\n", err)
			return exitUsage
		}
	}
	tgt, err := openTarget(ctx, rc.target)
	if err != nil {
		fmt.Fprintf(stderr, "contbench: %v\n", err)
		return exitUsage
	}
	defer func() {
		if err := tgt.close(ctx, false); err != nil {
			fmt.Fprintf(stderr, "contbench: %v\n", err)
		}
	}()
	if err := tgt.connect(ctx, rc.target); err != nil {
		fmt.Fprintf(stderr, "contbench: %v\n", err)
		return exitUsage
	}
	desc := tgt.desc
	if rc.target.backend == backendMemory {
		desc = "in-process store"
	}

	fmt.Fprintf(stdout, "contbench replay: %s, %s\n\n", desc, plural(len(rc.files), "trace file", "trace files"))
	r := newReplayer(tgt.stores[0], desc, stdout)
	for _, path := range rc.files {
		if ctx.Err() != nil {
			break
		}
		if err := r.replayPath(ctx, path); err != nil {
			fmt.Fprintf(stderr, "contbench: %v\n", err)
			return exitUsage
		}
	}
	r.report.write(stdout)
	if rc.jsonPath != "" {
		if err := writeJSON(rc.jsonPath, &r.report); err != nil {
			fmt.Fprintf(stderr, "contbench: %v\n", err)
			return exitUsage
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "contbench: interrupted")
		return exitInterrupted
	}
	return r.report.status(stderr)
}

// status returns the exit status of the replay rep describes, saying on
// stderr what was wrong with its traces.
func (rep *replayReport) status(stderr io.Writer) int {
	code := exitOK
	if n := rep.Malformed; n > 0 {
		fmt.Fprintf(stderr, "contbench: %s skipped (see the report)\n",
			plural(n, "malformed trace line was", "malformed trace lines were"))
		code = exitBadTrace
	}
	for _, f := range rep.FilesWithoutTurns {
		fmt.Fprintf(stderr, "contbench: no turns in %s\n", f)
		code = exitBadTrace
	}
	return code
}

// plural returns n with the singular or the plural noun, as n calls for.
func plural(n int, singular, plurals string) string {
	if n == 1 {
		return "1 " + singular
	}
	return fmt.Sprintf("%d %s", n, plurals)
}

// replayTotals sums turns.
type replayTotals struct {
	Turns int `json:"turns"`
	// LaterTurns counts the turns after an owner's first in its file.
	LaterTurns int `json:"later_turns"`
	Continued  int `json:"continued"`
	// Items and bytes sent upstream, against the full context.
	ItemsSent int `json:"items_sent"`
	ItemsFull int `json:"items_full"`
	BytesSent int `json:"bytes_sent"`
	BytesFull int `json:"bytes_full"`
	// Reasons counts turns by reason: "continued", the store's reasons,
	// "invalid_request".
	Reasons map[string]int `json:"reasons"`
	// Malformed counts the lines skipped as not trace lines.
	Malformed int `json:"malformed"`
}

// add counts t.
func (s *replayTotals) add(t *replayTurn) {
	s.Turns++
	if t.Later {
		s.LaterTurns++
	}
	if t.Reason == reasonContinued {
		s.Continued++
	}
	s.ItemsSent += t.ItemsSent
	s.ItemsFull += t.ItemsFull
	s.BytesSent += t.BytesSent
	s.BytesFull += t.BytesFull
	s.Reasons[t.Reason]++
}

// replayTurn is one replayed call.
type replayTurn struct {
	File  string        `json:"file"`
	Line  int           `json:"line"`
	Owner identityOwner `json:"owner"`
	// Later: not the owner's first turn in the file.
	Later bool `json:"later"`
	// Reason is "continued", the store's reason or "invalid_request".
	Reason             string `json:"reason"`
	PreviousResponseID string `json:"previous_response_id,omitempty"`
	ItemsSent          int    `json:"items_sent"`
	ItemsFull          int    `json:"items_full"`
	BytesSent          int    `json:"bytes_sent"`
	BytesFull          int    `json:"bytes_full"`
	// Outcome is what Record did with the call's response.
	Outcome string `json:"outcome,omitempty"`
	// Error is why the request is invalid or the record failed.
	Error string `json:"error,omitempty"`
	// Mismatch and Difference explain a miss on a later turn: where the
	// request departs from the previous turn's transcript.
	Mismatch   *fingerprint.Mismatch `json:"mismatch,omitempty"`
	Difference string                `json:"difference,omitempty"`
}

// identityOwner is an owner as a trace names it.
type identityOwner struct {
	Session string `json:"session"`
	Agent   string `json:"agent"`
}

// malformedLine is a line skipped as not a trace line.
type malformedLine struct {
	File  string `json:"file"`
	Line  int    `json:"line"`
	Error string `json:"error"`
}

// fileTotals sums one trace file.
type fileTotals struct {
	File string `json:"file"`
	replayTotals
}

// replayReport is everything a replay found; the text and the JSON show
// the same figures. MalformedLines describes the first malformed lines
// of each file (maxMalformedShown); Malformed counts them all.
type replayReport struct {
	Target string `json:"target"`
	replayTotals
	Files             []*fileTotals   `json:"files"`
	Turn              []*replayTurn   `json:"turn"`
	MalformedLines    []malformedLine `json:"malformed_lines,omitempty"`
	FilesWithoutTurns []string        `json:"files_without_turns,omitempty"`
}

// replayer replays traces through one store, printing each turn.
type replayer struct {
	s      *store.Store
	out    io.Writer
	report replayReport
}

// newReplayer returns a replayer on s, the store target describes, that
// prints each turn to out.
func newReplayer(s *store.Store, target string, out io.Writer) *replayer {
	return &replayer{s: s, out: out, report: replayReport{
		Target: target, replayTotals: replayTotals{Reasons: map[string]int{}},
		Files: []*fileTotals{}, Turn: []*replayTurn{},
	}}
}

// lastTurn is an owner's previous valid call in a file: what the next
// call is compared with.
type lastTurn struct {
	req    *fingerprint.Request
	output []json.RawMessage
}

// replayPath replays the trace file at path.
func (r *replayer) replayPath(ctx context.Context, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return r.replay(ctx, path, f)
}

// replay replays the trace read from rd, named name. Only a read error
// stops it; malformed lines are reported and skipped.
func (r *replayer) replay(ctx context.Context, name string, rd io.Reader) error {
	ft := &fileTotals{File: name, replayTotals: replayTotals{Reasons: map[string]int{}}}
	r.report.Files = append(r.report.Files, ft)
	// seen holds every owner met in the file, with its last valid call
	// (nil req when there is none yet).
	seen := map[identity.Owner]*lastTurn{}
	br := bufio.NewReader(rd)
	for n := 1; ctx.Err() == nil; n++ {
		raw, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(raw)) > 0 {
			r.line(ctx, ft, seen, n, raw)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
	}
	r.endFile(ft)
	return nil
}

// endFile says what the replay of file ft left unsaid: how many malformed
// lines were not described, and that the file held no turn.
func (r *replayer) endFile(ft *fileTotals) {
	if more := ft.Malformed - maxMalformedShown; more > 0 {
		fmt.Fprintf(r.out, "%s: … and %s\n", ft.File, plural(more, "more malformed line", "more malformed lines"))
	}
	if ft.Turns == 0 {
		fmt.Fprintf(r.out, "%s: no turns in the file\n", ft.File)
		r.report.FilesWithoutTurns = append(r.report.FilesWithoutTurns, ft.File)
	}
}

// line replays line n of file ft under the owner contproxy would derive
// (proxy.DefaultIdentity) from the line's headers and request, the line's
// owner standing for the session and agent headers; a request that has
// none (no session and no user message) is a missing_identity turn, never
// an owner's later turn.
func (r *replayer) line(ctx context.Context, ft *fileTotals, seen map[identity.Owner]*lastTurn, n int, raw []byte) {
	var tl traceLine
	owner, err := parseTraceLine(raw, &tl)
	if err != nil {
		r.malformed(ft, n, err)
		return
	}
	body := []byte(tl.Request)
	req, parseErr := r.s.ParseRequest(body)
	shown := owner // the owner as the trace names it, when it does
	if parseErr == nil {
		h, err := tl.header()
		if err == nil && !owner.IsZero() {
			// The trace names the session and agent the client sent:
			// contproxy derives the owner from them as from its headers.
			h.Set("X-Session-Id", owner.Session())
			h.Del("X-Agent-Id")
			if owner.IsAgent() {
				h.Set("X-Agent-Id", owner.AgentID())
			}
		}
		if err == nil {
			owner, err = proxy.DefaultIdentity.Owner(h, "", req)
		}
		if err != nil {
			r.malformed(ft, n, fmt.Errorf("no owner derived from the line's owner, headers and request: %w", err))
			return
		}
	}
	prev, later := seen[owner]
	if !later && !owner.IsZero() {
		// A file is a capture of its own: the owner starts from no state.
		if err := r.s.Clear(ctx, owner); err != nil {
			fmt.Fprintf(r.out, "%s:%d: clearing %v: %v\n", ft.File, n, owner, err)
		}
		prev = &lastTurn{}
		seen[owner] = prev
	}
	if shown.IsZero() {
		shown = owner
	}
	t := &replayTurn{File: ft.File, Line: n, Owner: identityOwner{shown.Session(), shown.AgentID()}, Later: later}
	t.BytesSent, t.BytesFull = len(body), len(body)

	if parseErr != nil {
		// A gateway sends what it cannot parse as it came.
		t.Reason, t.Error = reasonInvalidRequest, parseErr.Error()
	} else {
		res := r.s.Reserve(ctx, owner, req)
		t.Reason = string(res.Reason)
		if res.Continues() {
			t.Reason = reasonContinued
		}
		t.PreviousResponseID = res.PreviousResponseID
		t.ItemsSent, t.ItemsFull = res.UpstreamItems, req.Len()
		t.BytesSent = len(res.UpstreamBody())
		if later && !res.Continues() {
			t.explain(prev, req)
		}
		out, err := r.s.Record(ctx, res, store.Result{ResponseID: tl.ResponseID, Socket: store.Socket{Any: true}, Output: tl.Output})
		t.Outcome = string(out)
		if err != nil {
			t.Error = "record: " + err.Error()
		}
		if prev != nil {
			prev.req, prev.output = req, tl.Output
		}
	}
	ft.add(t)
	r.report.add(t)
	r.report.Turn = append(r.report.Turn, t)
	r.printTurn(shown, t)
}

// malformed counts line n of file ft as malformed because of err, and
// describes it while the file has not had maxMalformedShown.
func (r *replayer) malformed(ft *fileTotals, n int, err error) {
	ft.Malformed++
	r.report.Malformed++
	if ft.Malformed > maxMalformedShown {
		return
	}
	fmt.Fprintf(r.out, "%s:%d: malformed trace line, skipped: %v\n", ft.File, n, err)
	r.report.MalformedLines = append(r.report.MalformedLines, malformedLine{ft.File, n, err.Error()})
}

// explain sets the turn's mismatch: where req departs from the transcript
// of the owner's previous call.
func (t *replayTurn) explain(prev *lastTurn, req *fingerprint.Request) {
	if prev.req == nil {
		t.Difference = "no earlier valid request of the owner to compare with"
		return
	}
	m, err := fingerprint.Explain(prev.req, prev.output, req)
	if err != nil {
		t.Difference = "cannot explain: " + err.Error()
		return
	}
	t.Mismatch = &m
	var parts []string
	if len(m.Prompt) > 0 {
		parts = append(parts, "prompt members differ: "+strings.Join(m.Prompt, ", "))
	}
	switch {
	case m.Item < 0:
	case m.Item >= req.Len():
		parts = append(parts, fmt.Sprintf("input has %d items: it stops before transcript item %d", req.Len(), m.Item))
	case len(m.Members) > 0:
		parts = append(parts, fmt.Sprintf("item %d differs in members: %s", m.Item, strings.Join(m.Members, ", ")))
	default:
		parts = append(parts, fmt.Sprintf("item %d differs", m.Item))
	}
	if len(parts) == 0 {
		transcript := req.Len()
		if tr, err := prev.req.Transcript(prev.output); err == nil {
			transcript = tr.Items
		}
		if req.Len() == transcript {
			parts = append(parts, fmt.Sprintf("no difference: the input repeats the previous transcript (%d items) and adds nothing", transcript))
		} else {
			parts = append(parts, fmt.Sprintf("no difference: the input extends the previous transcript (%d of %d items)", transcript, req.Len()))
		}
	}
	t.Difference = strings.Join(parts, "; ")
}

// printTurn prints one turn and, for a miss on a later turn, its
// explanation.
func (r *replayer) printTurn(owner identity.Owner, t *replayTurn) {
	fmt.Fprintf(r.out, "%s:%d  %v  %s  items %d of %d, bytes %d of %d", t.File, t.Line, owner, t.Reason,
		t.ItemsSent, t.ItemsFull, t.BytesSent, t.BytesFull)
	if t.Outcome != "" && t.Outcome != string(store.OutcomePublished) {
		fmt.Fprintf(r.out, ", record %s", t.Outcome)
	}
	fmt.Fprintln(r.out)
	if t.Error != "" {
		fmt.Fprintf(r.out, "    %s\n", t.Error)
	}
	if t.Difference != "" {
		fmt.Fprintf(r.out, "    %s\n", t.Difference)
	}
}

// write prints the totals per file and over all files.
func (rep *replayReport) write(w io.Writer) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "trace\tturns\tlater turns\tcontinued\titems sent of full\tbytes sent of full\tmalformed")
	row := func(name string, s replayTotals) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d (%s)\t%d of %d (%s saved)\t%d of %d (%s saved)\t%d\n", name,
			s.Turns, s.LaterTurns, s.Continued, fraction(s.Continued, s.LaterTurns),
			s.ItemsSent, s.ItemsFull, fraction(s.ItemsFull-s.ItemsSent, s.ItemsFull),
			s.BytesSent, s.BytesFull, fraction(s.BytesFull-s.BytesSent, s.BytesFull), s.Malformed)
	}
	for _, f := range rep.Files {
		row(f.File, f.replayTotals)
	}
	if len(rep.Files) > 1 {
		row("all", rep.replayTotals)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "reasons: %s\n", reasonsString(rep.Reasons))
	fmt.Fprintln(w, "(continued as a fraction of later turns; saved as a fraction of the full context)")
	if rep.Malformed > 0 {
		fmt.Fprintf(w, "malformed lines: %d, skipped (described above, at most %d a file)\n", rep.Malformed, maxMalformedShown)
	}
}

// fraction formats n/d as a fraction, "-" when d is 0.
func fraction(n, d int) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", float64(n)/float64(d))
}

// reasonsString lists reason counts, most frequent first.
func reasonsString(reasons map[string]int) string {
	if len(reasons) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c := reasons[b] - reasons[a]; c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, reasons[k])
	}
	return strings.Join(parts, ", ")
}
