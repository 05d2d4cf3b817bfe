package session

import (
	"context"
	"time"
)

// Op names a session store operation, as observers see it.
type Op string

// Operations.
const (
	OpSave        Op = "save"
	OpSaveDurable Op = "save_durable"
	OpLoad        Op = "load"
	OpDelete      Op = "delete"
)

// Event describes one finished session store operation.
type Event struct {
	Op Op
	// ID is the session's id.
	ID string
	// Version is the head version the caller holds afterwards: for a save,
	// the session's Version (advanced on success and with ErrNotDurable,
	// unchanged otherwise); for a load, the loaded head's (0 on error);
	// 0 for a delete.
	Version uint64
	// Latency is the operation's duration as the caller saw it.
	Latency time.Duration
	// Err is the operation's error.
	Err error
}

// Observer sees every operation of a Store opened with
// StoreOptions.Observer. ObserveSession is called synchronously after the
// operation: it must be fast and safe for concurrent use.
type Observer interface {
	ObserveSession(Event)
}

// ObserverFunc is an Observer calling itself.
type ObserverFunc func(Event)

// ObserveSession calls f(ev).
func (f ObserverFunc) ObserveSession(ev Event) { f(ev) }

// observe returns a Store that passes every call to st unchanged and then
// reports it to obs; it returns st itself when obs is nil.
func observe(st Store, obs Observer) Store {
	if obs == nil {
		return st
	}
	return &observedStore{st: st, obs: obs}
}

type observedStore struct {
	st  Store
	obs Observer
}

func (o *observedStore) Save(ctx context.Context, s *Session) error {
	return o.save(ctx, OpSave, o.st.Save, s)
}

func (o *observedStore) SaveDurable(ctx context.Context, s *Session) error {
	return o.save(ctx, OpSaveDurable, o.st.SaveDurable, s)
}

func (o *observedStore) save(ctx context.Context, op Op, save func(context.Context, *Session) error, s *Session) error {
	start := time.Now()
	err := save(ctx, s)
	ev := Event{Op: op, Latency: time.Since(start), Err: err}
	if s != nil {
		ev.ID, ev.Version = s.ID, s.Version
	}
	o.obs.ObserveSession(ev)
	return err
}

func (o *observedStore) Load(ctx context.Context, id string) (*Session, error) {
	start := time.Now()
	s, err := o.st.Load(ctx, id)
	ev := Event{Op: OpLoad, ID: id, Latency: time.Since(start), Err: err}
	if s != nil && err == nil {
		ev.Version = s.Version
	}
	o.obs.ObserveSession(ev)
	return s, err
}

func (o *observedStore) Delete(ctx context.Context, id string) error {
	start := time.Now()
	err := o.st.Delete(ctx, id)
	o.obs.ObserveSession(Event{Op: OpDelete, ID: id, Latency: time.Since(start), Err: err})
	return err
}
