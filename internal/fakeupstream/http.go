package fakeupstream

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// maxBody bounds a request body.
const maxBody = 64 << 20

// Models are the model ids GET /v1/models lists.
var Models = []string{"gpt-5.1-codex", "gpt-5", "gpt-4.1"}

// ServeHTTP serves both transports. HTTP: POST …/responses (any base path,
// such as /v1/responses) creates a response, answered as JSON or, for
// "stream": true, as Server-Sent Events flushed one by one; GET …/models
// lists Models, and the other endpoints the package documentation lists
// are served by serveEndpoint. Over HTTP nothing is kept for store=false
// requests. A GET …/responses with a WebSocket upgrade opens a WebSocket
// mode connection (see the package documentation).
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case strings.HasSuffix(path, "/responses") && r.Method == http.MethodGet && upgradesToWebSocket(r):
		u.serveWebSocket(w, r)
	case strings.HasSuffix(path, "/responses"):
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, &Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
				Message: "Use POST to create a response."})
			return
		}
		u.serveCreate(w, r)
	default:
		u.serveEndpoint(w, r)
	}
}

// serveCreate answers a POST. A FaultDrop aborts the handler
// (http.ErrAbortHandler), which closes the connection: a JSON answer is
// never sent, a stream stops after the fault's events.
func (u *Upstream) serveCreate(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, invalid("", "", "Reading the request body: %v", err))
		return
	}
	req := Request{Body: body, Header: r.Header, Transport: TransportHTTP}
	res, apiErr := u.Create(req)
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	events := res.Events
	if res.Fault.Kind == FaultDrop {
		events = events[:min(res.Fault.Events, len(events))]
	}
	w.Header().Set("X-Request-Id", "req_"+res.ID[len("resp_"):len("resp_")+32])
	if !res.Stream {
		for range events {
			if !u.pause(r.Context()) {
				return // the client went away
			}
		}
		switch res.Fault.Kind {
		case FaultDrop:
			panic(http.ErrAbortHandler)
		case FaultError:
			writeError(w, streamError())
			return
		}
		writeJSON(w, http.StatusOK, res.Response)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	for _, ev := range events {
		if !u.pause(r.Context()) {
			return
		}
		var buf bytes.Buffer
		fmt.Fprintf(&buf, "event: %s\ndata: %s\n\n", ev.Type, ev.Data)
		if _, err := w.Write(buf.Bytes()); err != nil {
			return // the client went away
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	if res.Fault.Kind == FaultDrop {
		panic(http.ErrAbortHandler)
	}
}

func serveModels(w http.ResponseWriter) {
	data := make([]any, 0, len(Models))
	for _, id := range Models {
		data = append(data, object{{"id", id}, {"object", "model"}, {"created", 1700000000}, {"owned_by", "system"}})
	}
	writeJSON(w, http.StatusOK, object{{"object", "list"}, {"data", data}}.bytes())
}

func writeError(w http.ResponseWriter, e *Error) {
	for k, v := range e.Headers {
		w.Header().Set(k, v)
	}
	writeJSON(w, e.Status, mustMarshal(e))
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
