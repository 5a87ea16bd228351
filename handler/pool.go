package handler

import "time"

// workerIdle is how long a run's goroutine waits for the next run before
// it ends.
const workerIdle = time.Minute

// pool runs functions on goroutines kept between batches. A goroutine
// started per message grew its stack again on every run (the SDK's calls
// go deep): copying stacks took 7 % of a one-job batch. Kept goroutines
// keep their stacks; one idle for workerIdle ends, so a handler that is no
// longer used holds none for long.
type pool struct {
	work chan func()
}

func newPool() *pool { return &pool{work: make(chan func())} }

// run runs f on an idle goroutine, or on a new one if none is waiting.
func (p *pool) run(f func()) {
	select {
	case p.work <- f:
	default:
		go p.worker(f)
	}
}

func (p *pool) worker(f func()) {
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		f()
		f = nil // the batch it ran can go
		t.Reset(workerIdle)
		select {
		case f = <-p.work:
		case <-t.C:
			return
		}
	}
}
