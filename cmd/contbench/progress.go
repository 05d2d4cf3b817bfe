package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Progress refresh periods: of the bar on a terminal, and of the plain
// lines otherwise.
const (
	barEvery  = 200 * time.Millisecond
	lineEvery = 2 * time.Second
)

// showProgress shows how s is doing on w until the returned function is
// called: a progress bar when w is a terminal, a line every 2s otherwise.
func showProgress(w io.Writer, s *sim, label string) (stop func()) {
	if w == io.Discard {
		return func() {}
	}
	f, ok := w.(*os.File)
	terminal := ok && term.IsTerminal(int(f.Fd()))
	every := lineEvery
	var bar *progressbar.ProgressBar
	if terminal {
		every = barEvery
		bar = progressbar.NewOptions64(1000,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionThrottle(barEvery/2),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetDescription(label))
	}

	start := time.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				if bar != nil {
					_ = bar.Finish()
				}
				return
			case <-tick.C:
			}
			elapsed := time.Since(start)
			turns, continued := s.turns.Load(), s.continued.Load()
			status := fmt.Sprintf("%s: %d turns, %.0f turns/s, hit rate %.3f",
				label, turns, perSecond(turns, elapsed.Seconds()), share(continued, turns))
			if bar == nil {
				fmt.Fprintf(w, "contbench: %s\n", status)
				continue
			}
			bar.Describe(status)
			_ = bar.Set64(int64(1000 * s.done(elapsed)))
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// done returns the fraction of the run behind, by turns or by time,
// whichever is further.
func (s *sim) done(elapsed time.Duration) float64 {
	var f float64
	if s.cfg.turns > 0 {
		f = float64(s.turns.Load()) / float64(s.cfg.turns)
	}
	if s.cfg.duration > 0 {
		f = max(f, elapsed.Seconds()/s.cfg.duration.Seconds())
	}
	return min(f, 1)
}
