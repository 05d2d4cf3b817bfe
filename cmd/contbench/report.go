package main

// The report of a whole run: its runs, Redis and calibration sections, and
// the JSON file that holds them.

import (
	"encoding/json"
	"fmt"
	"os"
)

// report is everything a run found; the table and the JSON file show the
// same figures.
type report struct {
	// Headline is the comparison the report opens with.
	Headline      headline     `json:"headline"`
	Target        string       `json:"target"`
	Namespace     string       `json:"namespace,omitempty"`
	Seed          uint64       `json:"seed"`
	Replicas      int          `json:"replicas"`
	Concurrency   int          `json:"concurrency"`
	Conversations int          `json:"conversations"`
	Alike         int          `json:"alike,omitempty"` // the size of groups that open alike, sharing a main-thread owner
	Threads       int          `json:"threads"`         // main threads and sub-agents
	Owners        int          `json:"owners"`          // store owners the threads use (fewer with Alike)
	Sockets       int          `json:"sockets_per_replica"`
	Upstream      upstreamMode `json:"upstream"`
	Routing       routing      `json:"routing"`
	Forward       bool         `json:"forward"`
	TTLSeconds    float64      `json:"ttl_seconds"`
	Partitions    int          `json:"partitions"`
	// Run is the deployment's run, (a); OneReplica and PerReplica are the
	// baselines (b) and (c), when played.
	Run        runResult    `json:"deployment"`
	OneReplica *runResult   `json:"one_replica,omitempty"`
	PerReplica *runResult   `json:"per_replica_stores,omitempty"`
	Redis      *redisStats  `json:"redis,omitempty"`
	Calibrate  *calibration `json:"calibrate,omitempty"`
	// ClockLagMillis is the most a Redis server's clock fell behind this
	// machine's during the runs (clockwatch.go); ClockLagServer is that
	// server.
	ClockLagMillis float64  `json:"clock_lag_ms,omitempty"`
	ClockLagServer string   `json:"clock_lag_server,omitempty"`
	Notes          []string `json:"notes,omitempty"`
	// interrupted, when set, says how far the runs went before they were
	// interrupted (an inconclusive reason).
	interrupted string
}

// redisStats are the Redis server's figures.
type redisStats struct {
	UsedMemoryBefore int64 `json:"used_memory_before"`
	UsedMemoryAfter  int64 `json:"used_memory_after"`
	// BytesPerOwner is the growth of used_memory over the main run, script
	// cache left out, per live owner; both samples are taken without the
	// replicas' connections.
	BytesPerOwner float64 `json:"used_memory_per_owner"`
	// Scripts is the server time of every script during the main run;
	// Reserve and Record are measured alone after it.
	Scripts scriptTime `json:"scripts_main_run"`
	Reserve scriptTime `json:"reserve_alone"`
	Record  scriptTime `json:"record_alone"`
}

// scriptTime is the server time spent in script calls (INFO commandstats
// of FCALL, EVALSHA and EVAL).
type scriptTime struct {
	Calls       int64   `json:"calls"`
	Usec        int64   `json:"usec"`
	UsecPerCall float64 `json:"usec_per_call"`
}

// calibration compares the store's throughput with raw Redis ceilings.
type calibration struct {
	Seconds           float64 `json:"seconds_each"`
	PingPerSecond     float64 `json:"ping_per_second"`
	EvalshaPerSecond  float64 `json:"noop_evalsha_per_second"`
	StorePerSecond    float64 `json:"store_ops_per_second"`
	FractionOfEvalsha float64 `json:"fraction_of_evalsha"`
	// StoreAlonePerSecond counts the reserves and records of turns played
	// on the stores alone, without the workload (storeAlone).
	StoreAlonePerSecond    float64 `json:"store_alone_ops_per_second"`
	AloneFractionOfEvalsha float64 `json:"alone_fraction_of_evalsha"`
}

// newReport starts the report of a run of cfg on tgt.
func newReport(cfg *config, tgt *target) *report {
	rep := &report{
		Target:        tgt.desc,
		Namespace:     tgt.ns,
		Seed:          cfg.seed,
		Replicas:      cfg.replicas,
		Concurrency:   cfg.concurrency,
		Conversations: cfg.conversations,
		Threads:       cfg.conversations * (1 + cfg.agents),
		Owners:        cfg.conversations * (1 + cfg.agents),
		Sockets:       cfg.sockets,
		Upstream:      cfg.upstream,
		Routing:       cfg.routing,
		Forward:       cfg.forward,
		TTLSeconds:    cfg.ttl.Seconds(),
		Partitions:    cfg.partitions,
	}
	if cfg.alike > 1 {
		rep.Alike = cfg.alike
		rep.Owners = (cfg.conversations+cfg.alike-1)/cfg.alike + cfg.conversations*cfg.agents
	}
	return rep
}

// note adds a remark printed with the report.
func (r *report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// runs returns the simulations the report covers.
func (r *report) runs() []*runResult {
	runs := []*runResult{&r.Run}
	for _, b := range []*runResult{r.OneReplica, r.PerReplica} {
		if b != nil {
			runs = append(runs, b)
		}
	}
	return runs
}

// writeJSON writes rep, a report, to path as indented JSON.
func writeJSON(path string, rep any) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the JSON report: %w", err)
	}
	return nil
}
