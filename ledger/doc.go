// Package ledger keeps the record of every job in one DynamoDB table: the
// job record, the seven states, and every read and write of it. It imports
// nothing else of this project.
//
// # The record that is the key
//
// A job with an idempotency key lives under the partition key
// "k#<hash of the key>", so that the one conditional PutItem that creates
// it also enforces the DuplicatePolicy: the write succeeds only if the key
// is free, and when it fails DynamoDB returns the holder in the same
// response (ReturnValuesOnConditionCheckFailure), so deciding "existing id",
// "new job" or "rejected" costs no read. A job without a key lives under
// "j#<id>". When a terminal job's key is re-used, the old record is
// archived under "j#<old id>" and replaced in one transaction: the only
// enqueue path that costs more than one write. A keyed job's id carries its
// key hash, so Get finds any job from its id alone, without an index.
//
// Keys are stored hashed (128 bits of SHA-256, or of HMAC-SHA-256 with
// Options.KeySecret): no raw key, whatever personal data it holds, reaches
// the table, and the stored length is fixed.
//
// # Retention
//
// Terminal writes set the TTL attribute (expiresAt). DynamoDB deletes late
// (up to days) and emulators never, so every read and condition here treats
// a record past its expiresAt as gone: its key is free at once.
//
// # Runs and fencing
//
// Claim moves a job to Processing with a lease and a new fencing token in
// one conditional update that returns the record; Finish is conditional on
// that token, so a worker whose lease ran out cannot overwrite the result
// of the run that took over (ErrFenced).
//
// # Continuations
//
// A continuation's id is kept in each parent's Children set, so the
// parent's completing write returns its children (strongly consistent,
// no index). The child and those links are written in one
// TransactWriteItems (InsertContinuation, and WaitAgain when a requeue
// puts a child back to waiting): a crash leaves both or neither, never a
// child that no parent counts. A fan-in child counts its parents'
// successes in its Released set and is released when it holds them all.
//
// # How it fails
//
// AWS errors are wrapped with %w (errors.As reaches the SDK's types, e.g.
// *types.ResourceNotFoundException for a missing table). Policy rejections
// are *DuplicateJobError; a job that may not run now, *NotClaimableError
// with its current record; unknown ids, ErrNotFound or ErrBadID. A write
// either happens whole or not at all.
//
// PutItem and UpdateItem carry no idempotency token, and DynamoDB may
// apply a write and still answer 500; the SDK then resends it and the
// resend fails its condition against the write itself. Every update here
// writes a nonce, and every insert a fresh random id, so a failed
// condition that finds its own nonce or id reads as the success it is.
// The nonce is random per logical write (Finish.Nonce keeps one across a
// caller's retries), never derived from what the writer read: two writers
// acting on the same record (two workers ending one orphan, a zombie and
// the run that replaced it) never take each other's write for their own.
// The record keeps its last three nonces (nonce, nonce1, nonce2, shifted
// by each update), so a write is recognised even after two other writes
// landed between it and its resend. An update whose error does not tell
// (applied, its reply lost, the resends throttled past the SDK's retries;
// a timeout) is followed by one consistent read that looks for its nonce;
// when that read fails too, the error is an *UnknownOutcomeError. An
// insert whose outcome its error does not tell is an *UnknownOutcomeError
// naming the id to look for. The continuations' transactions are
// recognised the same way: the child's fresh id (InsertContinuation) or
// its update's nonce (WaitAgain), in the item the cancelled resend
// returns or in the read after an open outcome.
package ledger
