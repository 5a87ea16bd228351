package handler

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Patches: changing durable code while jobs sleep (DBOS's Patch,
// Temporal's GetVersion).
//
// A kind declares the patches its code knows (KindOptions.Patches). A job
// of the kind records, at its first run, the patches its code knew then
// (a step of the package's own, "nexjob:patches"); Patched(ctx, name)
// answers from that record for the job's whole life. So a job that began
// before a deploy added a patch takes the old branch on every run after
// it, and a job that began after takes the new one, wherever in the code
// the branch is, before or after a sleep. A job that began before its kind
// declared any patch (no record, and steps or a run already) records an
// empty list: every patch is false for it.
//
// Retiring a patch: once no open job of the kind lacks it (admin's
// PatchUse, `nexjob patches KIND NAME`), the old branch can go, then the
// name from Patches (Patched of a name no longer declared is false).
//
// How it fails. The record is written before the worker runs: a write
// that fails fails the run (the job's retry policy), and the next run,
// finding steps of the job but no record, records the empty list only if
// the job ran user code before (its steps read back: one Query); a job
// whose first run failed before any step records the list it knows then.
//
// Cost: one step write at a job's first run (kinds with patches only);
// none after (its value comes with the job's steps).

// patchesStep is the step that keeps the patches a job's code knew at its
// first run.
const patchesStep = "nexjob:patches"

// Patched reports whether job's code, at its first run, knew patch name
// (declared in its kind's KindOptions.Patches): the new branch's condition.
// The same on every run of the job. Outside a run, or for a kind with no
// patches, false.
func Patched(ctx context.Context, name string) bool {
	s := stepsOf(ctx)
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.patches, name)
}

// settlePatches reads the job's recorded patches, recording them first
// when the job has none: declared, for a job that never ran user code;
// none, for one that did.
func (s *steps) settlePatches(ctx context.Context, declared []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok, err := s.value(ctx, patchesStep)
	if err != nil {
		return err
	}
	if !ok {
		fresh := s.rec.Token == 1 || (!s.rec.Ran() && len(s.rec.Steps) == 0 && (s.off == nil || len(s.off.Values) == 0))
		list := []string{}
		if fresh {
			list = slices.Clone(declared)
		}
		b, _ := json.Marshal(list) // strings
		s.mu.Unlock()
		v, err = s.record(ctx, patchesStep, string(b))
		s.mu.Lock()
		if err != nil {
			return err
		}
	}
	var got []string
	if err := json.Unmarshal([]byte(v), &got); err != nil {
		return Permanent(fmt.Errorf("nexjob: the job's recorded patches do not decode: %w", err))
	}
	s.patches = got
	return nil
}

// checkPatches refuses patch names a step's name could not hold.
func checkPatches(names []string) error {
	for _, n := range names {
		if err := checkUserName(n); err != nil {
			return fmt.Errorf("nexjob: KindOptions.Patches: %w", err)
		}
	}
	b, _ := json.Marshal(names)
	if len(b) > ledger.MaxStepBytes {
		return fmt.Errorf("nexjob: KindOptions.Patches: %d bytes of names, the most is %d", len(b), ledger.MaxStepBytes)
	}
	return nil
}
