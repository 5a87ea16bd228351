// Package caller proves that a child job's enqueue comes from its
// caller's own run. Package handler makes a Caller of the job a run holds
// (handler.InvokeAsync) and hands it to enqueue.Client.EnqueueChild; code
// outside this module cannot import this package, so it cannot make one:
// a user who can enqueue jobs cannot name someone else's job as a child's
// caller, and so cannot have that job read an outcome of the user's
// making. The zero Caller names no job, and EnqueueChild refuses it.
package caller

import "github.com/nexjob/nexjob-aws/ledger"

// Caller is the job whose run starts a child.
type Caller struct{ rec ledger.Record }

// Of is the job rec, held by the run that starts a child.
func Of(rec ledger.Record) Caller { return Caller{rec: rec} }

// Record is the caller's record as its run claimed it; the zero Record
// for the zero Caller.
func (c Caller) Record() ledger.Record { return c.rec }
