package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/contstore/contstore/store"
)

// Defaults of Learning.
const (
	defaultPauseRefusals = 3
	defaultCooldown      = time.Minute
	defaultMaxCooldown   = time.Hour
)

// maxLearnedModels bounds the models, of every account, the learner keeps
// state for: only models with refusals not yet made up for by an accepted
// continuation take room. Past the bound a new model takes the room of
// one that is not paused, or is not learned about when every one is.
const maxLearnedModels = 1024

// Learning says when the proxy stops continuing turns the upstream cannot
// continue, as OpenAI-compatible servers that keep no responses refuse
// every previous_response_id. After Refusals refused continuations in a
// row for one model, the proxy sends that model's turns with the full
// context for Cooldown; then the next turn that could continue is sent
// continued, as a probe. A refused probe doubles the pause, up to
// MaxCooldown; an accepted continuation ends it. The turns are reserved and
// recorded all along, so that the probe has a continuation to try. What is
// learned holds for the account whose continuations were refused (its
// credential, organization and project headers), as the upstream keeps
// each account's responses: one whose responses are gone, deleted or
// never kept, pauses no other.
type Learning struct {
	// Refusals is how many refused continuations in a row, with no
	// accepted one between, pause continuing for a model. Default 3;
	// negative: never pause.
	Refusals int
	// Cooldown is the first pause. Default 1 minute.
	Cooldown time.Duration
	// MaxCooldown bounds the pause. Default 1 hour (or Cooldown, when
	// longer).
	MaxCooldown time.Duration
	// Now is the learner's clock (time.Now when nil).
	Now func() time.Time
}

// check validates l and fills its defaults.
func (l *Learning) check() error {
	switch {
	case l.Cooldown < 0 || l.MaxCooldown < 0:
		return fmt.Errorf("%w: negative Learning.Cooldown %v or MaxCooldown %v", ErrInvalidConfig, l.Cooldown, l.MaxCooldown)
	case l.MaxCooldown > 0 && l.MaxCooldown < l.Cooldown:
		return fmt.Errorf("%w: Learning.MaxCooldown %v is below Cooldown %v", ErrInvalidConfig, l.MaxCooldown, l.Cooldown)
	}
	if l.Refusals == 0 {
		l.Refusals = defaultPauseRefusals
	}
	if l.Cooldown == 0 {
		l.Cooldown = defaultCooldown
	}
	if l.MaxCooldown == 0 {
		l.MaxCooldown = max(defaultMaxCooldown, l.Cooldown)
	}
	if l.Now == nil {
		l.Now = time.Now
	}
	return nil
}

// learner keeps, per account and model, whether the upstream refuses
// continuations. The proxy has one upstream, so these name the state.
type learner struct {
	cfg Learning

	mu     sync.Mutex
	models map[learned]*modelState
}

// learned names what the learner learns about: a model, for an account.
type learned struct {
	account [32]byte
	model   string
}

// maxModelName bounds the model names the proxy keeps, logs and exports
// (contproxy_continuation_paused's label): the client picks the name, and
// an upstream may take any.
const maxModelName = 128

// modelName returns model as the proxy keeps and shows it: valid UTF-8,
// and within maxModelName bytes, a longer name cut and followed by a
// digest of the whole, so that two names stay apart.
func modelName(model string) string {
	model = strings.ToValidUTF8(model, "\uFFFD")
	if len(model) <= maxModelName {
		return model
	}
	sum := sha256.Sum256([]byte(model))
	return strings.ToValidUTF8(model[:maxModelName-20], "") + "…" + hex.EncodeToString(sum[:8])
}

// learnedOf returns what a turn of model with request headers h and URL
// query query is learned as: its account is a digest of its credential
// scope (the owners' own, scoped).
func learnedOf(h http.Header, query, model string) learned {
	return learned{account: sha256.Sum256(scoped("", h, query)), model: modelName(model)}
}

// modelState is what the learner knows of one model; a model with none
// continues.
type modelState struct {
	// refusals counts refused continuations since the last accepted one.
	refusals int
	// pause is the current pause, 0 while the model continues; until is
	// when it ends.
	pause time.Duration
	until time.Time
	// probing tells whether the probe ending the pause is in flight.
	probing bool
}

// change is what a refused or accepted continuation did to a model.
type change int

const (
	unchanged change = iota
	paused           // continuing stopped
	extended         // a refused probe lengthened the pause
	resumed          // an accepted continuation ended the pause
)

func newLearner(cfg Learning) *learner {
	return &learner{cfg: cfg, models: map[learned]*modelState{}}
}

// allow tells whether a turn of model may be sent continued, and whether
// it is the probe that ends a pause: one turn once the pause is over.
func (l *learner) allow(model learned) (ok, probe bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.models[model]
	switch {
	case s == nil || s.pause == 0:
		return true, false
	case s.probing || l.cfg.Now().Before(s.until):
		return false, false
	}
	s.probing = true
	return true, true
}

// open reports whether model's continuations are not paused, changing
// nothing: a turn may be sent continued before it asks (allow).
func (l *learner) open(model learned) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.models[model]
	return s == nil || s.pause == 0
}

// refused notes a refused continuation of model; probe tells whether it
// was the probe. It returns what changed and the pause now running.
func (l *learner) refused(model learned, probe bool) (change, time.Duration) {
	if l.cfg.Refusals < 0 {
		return unchanged, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.models[model]
	if s == nil {
		if len(l.models) >= maxLearnedModels && !l.evictOne() {
			return unchanged, 0
		}
		s = &modelState{}
		l.models[model] = s
	}
	s.refusals++
	switch {
	case s.pause == 0 && s.refusals >= l.cfg.Refusals:
		s.pause, s.until = l.cfg.Cooldown, l.cfg.Now().Add(l.cfg.Cooldown)
		return paused, s.pause
	case probe && s.pause != 0:
		s.probing = false
		s.pause = min(2*s.pause, l.cfg.MaxCooldown)
		s.until = l.cfg.Now().Add(s.pause)
		return extended, s.pause
	}
	return unchanged, s.pause
}

// evictOne forgets a model that is not paused; false when all are. l.mu
// is held.
func (l *learner) evictOne() bool {
	for m, s := range l.models {
		if s.pause == 0 {
			delete(l.models, m)
			return true
		}
	}
	return false
}

// accepted notes an accepted continuation of model: it forgets the
// refusals, and ends a pause.
func (l *learner) accepted(model learned) change {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.models[model]
	if s == nil {
		return unchanged
	}
	delete(l.models, model)
	if s.pause != 0 {
		return resumed
	}
	return unchanged
}

// undecided notes a probe that was neither refused nor accepted (it could
// not be sent continued, or the upstream failed otherwise): the next turn
// probes.
func (l *learner) undecided(model learned) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.models[model]; s != nil {
		s.probing = false
	}
}

// pausedModels returns the models whose continuations are paused for
// some account, sorted, each once.
func (l *learner) pausedModels() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for m, s := range l.models {
		if s.pause != 0 {
			out = append(out, m.model)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// PausedModels returns the models whose continuations are paused now for
// some account, because the upstream refused them (see Learning), sorted.
func (p *Proxy) PausedModels() []string { return p.learn.pausedModels() }

// reasonPaused is the reason a turn's log line gives when it was offered
// a continuation and sent with the full context because of a pause.
const reasonPaused = "continuation_paused"

// gate is one turn's permission to continue, as the learner gave it.
type gate struct {
	p     *Proxy
	model learned
	// paused tells whether the turn, offered a continuation, goes with
	// the full context because continuing is paused for its model.
	paused bool
	// probe tells whether the turn is the probe ending the pause;
	// settled, whether its verdict was noted.
	probe, settled bool
}

// gate asks the learner whether t, when its reservation continues, may be
// sent continued. When it may not, t no longer asks for the socket holding
// its previous response: it goes with the full context wherever it lands.
// A turn sent on its guess was let go by the learner then; it keeps that
// answer (early.go), whose refusal or acceptance the gate notes.
func (p *Proxy) gate(t *turn) *gate {
	g := &gate{p: p}
	if !t.res.Continues() && t.early == nil {
		return g
	}
	g.model = learnedOf(t.header, t.query, member(t.res.Request(), "model").String())
	if t.early != nil {
		return g
	}
	ok, probe := p.learn.allow(g.model)
	g.probe = probe
	if !ok {
		g.paused = true
		t.want, t.prev = store.Socket{}, ""
	}
	return g
}

// refused notes that the upstream refused the turn's continuation.
func (g *gate) refused() {
	g.settled = true
	what, pause := g.p.learn.refused(g.model, g.probe)
	lg := g.p.cfg.Logger.With("model", g.model.model)
	switch what {
	case paused:
		lg.Warn(fmt.Sprintf("upstream refuses continuations; sending full context for %v", pause),
			"refusals", g.p.cfg.Learning.Refusals)
	case extended:
		lg.Debug("upstream still refuses continuations; pause extended", "pause", pause)
	}
}

// accepted notes that the upstream answered the turn's continuation.
func (g *gate) accepted() {
	g.settled = true
	if g.p.learn.accepted(g.model) == resumed {
		g.p.cfg.Logger.Info("upstream accepts continuations again; continuing", "model", g.model.model)
	}
}

// done ends the turn: a probe with no verdict lets the next turn probe.
func (g *gate) done() {
	if g.probe && !g.settled {
		g.p.learn.undecided(g.model)
	}
}

// reason returns the reason a turn's log line gives: the reservation's,
// or reasonPaused.
func (g *gate) reason(r store.Reason) string {
	if g.paused {
		return reasonPaused
	}
	return string(r)
}
