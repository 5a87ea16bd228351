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
// deadline becomes Expired without running.
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
// back without spending an attempt. Messages that are not jobs are moved
// to the DLQ with the reason (Options.DLQURL) or left to the redrive
// policy. AWS errors while recording send the message back; the ledger's
// conditions make the replay safe.
package handler
