// Package idempotency makes any Go function or Lambda handler idempotent
// by a key: the first call with a key runs and records its result; a
// repeat returns the recorded result without running (Result.Replayed),
// for as long as the record is kept (Options.Retention, a TTL: 7 days by
// default, not an hour). It is the Powertools for AWS Lambda idempotency
// utility's behaviour, for Go, on the nexjob table and under the same
// DuplicatePolicy as an enqueue.
//
//	store, err := idempotency.New(cfg, table, nil)
//	res, err := idempotency.Do(ctx, store, r.Header.Get("Idempotency-Key"), func(ctx context.Context) (Receipt, error) {
//		return charge(ctx, card, amount)
//	}, &idempotency.CallOptions{Payload: req})
//
// Handler wraps a whole Lambda handler (the key and the validated payload
// taken from the event by functions or JMESPath expressions), and SQSBatch
// (KinesisBatch, DynamoDBStreamBatch; Records for any other source) runs
// each record of a batch idempotently and reports the failed ones as
// BatchItemFailures.
//
// # What a repeat gets
//
// While the first call runs, it holds the key until its context's
// deadline (under Lambda: the invocation's end; otherwise Options.Hold
// from its start): a repeat then gets an *InProgressError, or, with
// Options.Wait, waits for the first call's outcome. A call that timed out
// is retried right after its deadline: the hold has ended (allowing
// Options.MaxClockSkew, a second by default, for the difference between
// two processes' clocks; clocks further apart than that let a second call
// run beside the first) and the next call takes the key. After the first
// call:
//
//	the first call                AllowAfterFailed  RejectIfFailed        RejectAlways (the default)
//	returned a result (recorded)  runs again        runs again            replayed: Result.Replayed
//	returned an error             runs again        runs again            runs again
//	returned an error, recorded   runs again        *DuplicateError       *DuplicateError
//	(Options.RecordErrors)
//
// An error releases the key (the record is deleted: a retry runs again)
// unless Options.RecordErrors records it as Failed; then the policy
// decides, exactly as it decides an enqueue's re-use of a Failed job's
// key. A Succeeded record is kept for a repeat only under RejectAlways:
// the other two policies let a new call take the key once the first
// succeeded, as they let a new job take a Succeeded job's key. A repeat
// whose payload (CallOptions.Payload) differs from the first call's gets
// a *PayloadMismatchError while the first call holds the key or while its
// recorded outcome answers repeats; an outcome the policy lets a new call
// replace is replaced whatever the new call's payload.
//
// # Keys and what is stored
//
// A key is stored hashed (the ledger's key hash: HMAC-SHA-256 with the
// deployment's key secret, which New reads as every role of the deployment
// does, from NEXJOB_KEY_SECRET_PARAMETER's SSM parameter or
// NEXJOB_KEY_SECRET; with neither, SHA-256), scoped to Options.Function:
// two functions using one key hold two records, each under its function's
// partition key prefix "i#<function>#", which the construct's
// GrantIdempotency limits that function's grant to (no function reads or
// writes another's records); New refuses a Function other than the name
// the deployment gives the function (NEXJOB_IDEMPOTENCY_FUNCTION) with a
// *FunctionError. The payload is stored as
// its hash: the hash of its JSON with every object's keys sorted (as
// Powertools sorts them), so the same fields in another order are the same
// payload. An event's JSON integers are kept exact for its key and
// payload, however large (as Powertools' Python keeps them): two ids one
// float64 rounds alike are two keys. A key an expression finds is typed as
// in Powertools: a string is the key Do takes as that string, any other
// value is keyed by its JSON apart from the strings (the string "1" and
// the number 1 are two keys). In an HTTP event (API Gateway, ALB, function
// URLs) a KeyPath or PayloadPath finds a header whatever the case of its
// name. The result is stored as its JSON, at most Options.MaxResultBytes
// (default DefaultMaxResultBytes); a larger one is returned to the first
// caller with a *ResultTooLargeError (one with no JSON, such as a NaN,
// with an *UnencodableResultError), the key recorded as used without a
// result; a repeat is answered as any repeat of a recorded result: under
// RejectAlways with the same error, the function not run again.
// Logs, spans and metrics carry the key's hash, never the key, the
// payload or the result.
//
// # Costs
//
// A first call: PutItem (the hold, 1 write unit) and UpdateItem (its
// result: 1 write unit per started KB of the record). A repeat: one
// PutItem whose condition fails and returns the record (DynamoDB bills a
// failed condition as a write of the item's size: 1 write unit for a
// record under 1 KB), or nothing at all when the result is in this
// process's cache (Options.CacheSize). An error released: PutItem and
// DeleteItem. A new call taking a recorded outcome the policy lets go:
// two PutItems (the second conditional on the outcome it replaces), then
// UpdateItem. TestCallCosts pins the requests and units.
//
// # How it fails
//
// Every write is conditional on the caller's own token, so a write whose
// reply was lost and that the SDK resent reads as the success it was: a
// first call whose hold was applied runs once, a result recorded is not
// recorded twice, a release is done. A hold that DynamoDB refused or
// throttled past the SDK's retries returns the error and the function has
// not run. A result that cannot be recorded (throttled past the retries)
// is returned with a *NotRecordedError: the function ran; its key stays
// held until the hold ends, and a repeat after that runs it again. A
// result write that meets the key's record no longer the call's reads,
// while the hold has not ended and the policy lets later calls replace
// the outcome, as the success it was (only the call's own applied write,
// its reply lost, can have changed the hold; later calls the policy let
// in then replaced or released the outcome before the resend); where the
// policy protects the outcome, and after the hold's end, it is a
// *NotRecordedError wrapping
// ledger.ErrCallTakenOver, which says it can mean either that another
// call took the key (not recorded) or that case. A release that fails is
// joined to the function's error; the key is then free when the hold
// ends. A function that panics releases the key and panics on.
//
// The records live in the nexjob table unless Options.Backend names
// another store: MemoryBackend (this process, for unit tests) or package
// redisstore's (a Redis or Valkey server). Every Backend keeps the
// promises above; package idemtest is their behaviour suite, run on each.
//
// Turn the utility off (every call runs its function, nothing is read or
// written) with Options.Disabled or NEXJOB_IDEMPOTENCY_DISABLED=true: for
// unit tests of the function itself.
package idempotency
