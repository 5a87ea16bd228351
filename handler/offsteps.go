package handler

import (
	"context"

	"github.com/nexjob/nexjob-aws/ledger"
)

// A run's view of its job's steps in the steps table
// (ledger.Options.StepsTable): read at its first look-up of one, and
// noted when it records one (the record then shows it ran).

// value is the recorded result of step name ("", false: none). Called
// with s.mu held. Steps on the record (all of them without a steps table,
// and those recorded before one was set) are read first.
func (s *steps) value(ctx context.Context, name string) (string, bool, error) {
	if v, ok := s.rec.Steps[name]; ok {
		return v, true, nil
	}
	if !s.store.OffRecord(name) {
		return "", false, nil
	}
	if err := s.load(ctx); err != nil {
		return "", false, err
	}
	v, ok := s.off.Values[name]
	return v, ok, nil
}

// load reads the job's steps from the steps table, once a run. A job's
// first claim (its fencing token 1: every claim adds one, nothing takes
// one back) has nothing there: no run before it could write a step.
func (s *steps) load(ctx context.Context) error {
	if s.off != nil {
		return nil
	}
	if s.rec.Token == 1 {
		s.off = &ledger.OffSteps{Values: map[string]string{}}
		return nil
	}
	off, err := s.store.LoadSteps(ctx, s.rec)
	if err != nil {
		return err
	}
	s.off = &off
	return nil
}

// ran reports whether this run recorded a step in the steps table.
func (s *steps) ran() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ranOff
}

// sleep notes that the run met e, and returns it.
func (s *steps) sleep(e *sleepError) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping() {
		return s.stopRefusal() // asked to stop and compensate: it sleeps no more
	}
	if s.slept == nil {
		s.slept = e
	}
	return e
}

// lookIfDue reads the record for a cancel or a newer claim (ledger's
// Look) when CancelLook passed since the run last did: a step's own write
// in the steps table cannot check the record. Not while compensating.
// Called with s.mu held.
func (s *steps) lookIfDue(ctx context.Context) error {
	now := s.store.Now()
	if now.Sub(s.looked) < ledger.CancelLook || s.compensating || s.replay != nil {
		return nil
	}
	if err := s.store.Look(ctx, s.rec); err != nil {
		return err
	}
	s.looked = now
	return nil
}

// pending is the sleep the run met, nil if none.
func (s *steps) pending() *sleepError {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slept
}
