// Package handler runs jobs: a typed registry of workers and the SQS batch
// handler that the Lambda function starts.
//
//	reg := handler.NewRegistry()
//	handler.AddWorker(reg, handler.WorkFunc[PaymentArgs](charge), nil)
//	h, err := handler.New(cfg, table, queueURL, reg, nil)
//	lambda.Start(h.Handle)
//
// For each message Handle claims the job (one conditional update to
// Processing with a lease and a fencing token), runs the worker, and
// records the result conditional on that token: Succeeded (releasing its
// continuations), Scheduled for a retry with backoff (sent again as a new
// delayed message, so retries never count against the DLQ's
// maxReceiveCount), or Failed (the dead-letter hook runs). A job past its
// deadline becomes Expired without running. A Failed or Expired job ends
// the continuations still waiting on it, and theirs after them, down the
// whole tree: an ended child with continuations of its own is sent its
// message, and the worker that receives it ends them (one level per
// message; a crash mid-way is resumed by the message coming back).
//
// A worker that has an answer returns it: AddWorkerResult with a
// ResultWorker (ResultFunc[T, R]) keeps the run's result, R as JSON of
// at most ledger.MaxResultBytes, with the record, written by the same
// update that makes the job Succeeded; enqueue's Client.Result and Wait
// read it. A result over the limit, or that does not encode, fails the
// job permanently and is not stored.
//
// # How it fails
//
// A worker's error retries; Permanent(err) fails at once; RetryAfter(d,
// err) picks the delay; a panic is a failed attempt. A duplicate delivery
// of a finished job is acknowledged without running it; one of a job
// running elsewhere comes back when that run's lease ends. A worker that
// dies leaves the job Processing: its lease runs out, the redelivered
// message takes it over (the attempt is spent) or, with none left, fails
// it with ErrOrphaned. A run cut off by the invocation's deadline goes
// back without spending an attempt, MaxCutOffs times in a row at most;
// KindOptions.Timeout bounds a run. Handle returns before the invocation
// ends even if a worker ignores its context (the straggler's message
// comes back). A kind with no worker here is retried
// (UnknownKindBackoff). Messages that are not jobs are moved to the DLQ
// with the reason (Options.DLQURL) or left to the redrive policy.
//
// AWS may apply a write and lose its reply; the ledger reads a resend
// that meets its own write as applied, so a claim or a finish is never
// mistaken for another run's. A finish that fails for a passing reason (a
// throttle through the SDK's retries) is tried again while the lease
// lasts; other AWS errors send the message back, and the ledger's
// conditions make the replay safe. The DLQ consumer (HandleDeadLetters)
// lets the ledger decide, not the receive count: a job with attempts left
// (never started, or its last worker lost) is sent back, at most
// MaxReturns times, each dead letter counted once; a poison job, its
// worker lost in its last attempt, ends Failed (ErrOrphaned), so it
// crashes at most MaxAttempts workers; one sent back MaxReturns times
// ends Failed too (ErrNeverStarted, or ErrOrphaned if a run started).
package handler
