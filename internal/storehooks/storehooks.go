// Package storehooks reaches two controls that package store keeps out of
// its API, for this module's own tools and checks: the clock of an
// in-process store and of the circuit breakers (a check moves it), and a
// second replica's view of an in-process store's state (contbench and the
// conformance suite host several replicas in one process). Package store
// sets the hooks as it initialises, so a program that imports store finds
// them set.
package storehooks

import "time"

// The hooks as package store sets them; untyped because store imports this
// package.
var withClock, withReplica any

// Set is called by package store as it initialises: clock is a
// func(store.Options, func() time.Time) store.Options, replica a
// func(*store.Store, string) *store.Store.
func Set(clock, replica any) { withClock, withReplica = clock, replica }

// WithClock returns the store.Options opts with the clock of the
// in-process backend and of the circuit breakers set to now (nil for the
// default, time.Now). The Redis backend keeps every state on its server's
// clock whatever this says.
func WithClock[Options any](opts Options, now func() time.Time) Options {
	return withClock.(func(Options, func() time.Time) Options)(opts, now)
}

// WithReplica returns a *store.Store that shares s's state, options and
// circuit breakers but names replica ("" for a random name) as the origin
// of responses recorded without one.
func WithReplica[Store any](s Store, replica string) Store {
	return withReplica.(func(Store, string) Store)(s, replica)
}
