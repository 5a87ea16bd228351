// Package enqueue is the producer API: Enqueue, schedules, ContinueWith,
// Requeue, the DuplicatePolicy values and the duplicate error.
//
// An enqueue is one conditional DynamoDB write (the ledger's), then one SQS
// send carrying only the job id and kind. The result tells a new job from a
// deduplicated one:
//
//	res, err := client.Enqueue(ctx, PaymentArgs{OrderID: id}, &enqueue.Opts{
//		IdempotencyKey:  "payment-" + id,
//		DuplicatePolicy: enqueue.AllowAfterFailed,
//	})
//	var dup *enqueue.DuplicateJobError
//	switch {
//	case errors.As(err, &dup): // rejected: dup.ExistingJobID, dup.ExistingState
//	case err != nil:           // bad input (*InputError), AWS trouble (wrapped)
//	case res.Duplicate:        // an active job already had the key: res.ID is it
//	}
//
// # Policies
//
// Active jobs (Enqueued, Scheduled, Processing, AwaitingContinuation) are
// always deduplicated. For terminal ones: AllowAfterFailed (the default)
// lets a new job take the key; RejectIfFailed refuses after Failed;
// RejectAlways refuses after any terminal state.
//
// # How it fails
//
// Bad input is an *InputError (errors.Is(err, ErrInvalidInput)) and
// nothing is written. A missing table or queue is a *MissingResourceError;
// call Ping at start to find out there. If the ledger write succeeds and
// the SQS send fails, the error is a *DispatchError naming the job.
package enqueue
