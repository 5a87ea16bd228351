package ledger

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
)

// Signals and the waits for them are kept in a job's steps (Record.Steps)
// under names a step of the worker's cannot take: they ride on the claim's
// record and count in the steps' limits.
const (
	reservedStep = "nexjob:"
	signalStep   = reservedStep + "signal:"
	waitStep     = reservedStep + "wait:"
	tokenStep    = reservedStep + "token:"
)

// TokenStep is the step name that keeps the nonce of the callback token a
// run of the job issued for signal name (CallbackToken): a token is valid
// only for the job that holds its nonce.
func TokenStep(name string) string { return tokenStep + name }

// SignalStep is the step name that keeps signal name's payload, and
// WaitStep the one that keeps the end (Unix ms) of a wait for it.
func SignalStep(name string) string { return signalStep + name }

// WaitStep: see SignalStep.
func WaitStep(name string) string { return waitStep + name }

// Reasons a Signal is refused (wrapped in a *SignalRefusedError).
var (
	ErrSignalSent    = errors.New("a signal of this name was sent to the job already")
	ErrSignalTooLate = errors.New("the job's wait for this signal timed out")
	ErrJobEnded      = errors.New("the job has ended")
)

// SignalRefusedError refuses a signal; nothing was written. Err is one of
// ErrSignalSent, ErrSignalTooLate, ErrJobEnded.
type SignalRefusedError struct {
	JobID, Name string
	State       State
	Err         error
}

func (e *SignalRefusedError) Error() string {
	return fmt.Sprintf("nexjob: signal %q to job %s (%s) refused: %v", truncate(e.Name, MaxStepName), e.JobID, e.State, e.Err)
}

func (e *SignalRefusedError) Unwrap() error { return e.Err }

// Signal records payload (JSON) as signal name of job id: one strongly
// consistent read, and one conditional UpdateItem on the record as read
// (the same number of steps, so a step or a signal written meanwhile
// makes it read again), and the job's record as it now is. The signal is
// held to the steps' limits with the job's steps and args, as a step is
// (MaxSteps, MaxStepsBytes, the item's room; a *StepError, nothing
// written): signals are kept in the steps, and before, 24 signals of 16
// KB took a record past DynamoDB's item limit. The first signal of a
// name wins: a second with another payload is refused (ErrSignalSent; the
// same payload, a caller's retry, reads as the success it was, nothing
// written, even once the job took it and ended), as is one to a job that
// ended (ErrJobEnded) or whose wait for
// the name timed out (ErrSignalTooLate: the run that met the wait's end
// recorded its timeout; no clock but that record decides, so a signal
// late by its sender's clock that lands first is the wait's payload). A signal sent before the job
// waits is kept for the wait. A resend of an applied write (its reply
// lost) reads as the success it was. Name and payload are held to the
// steps' limits (*StepError), the wait's own name (WaitStep) included.
func (s *Store) Signal(ctx context.Context, id, name, payload string) (Record, error) {
	return s.signal(ctx, id, name, "", payload)
}

// Complete records payload as the signal a callback token names
// (CallbackToken), as Signal does, once the token's MAC holds under the
// key secret and the job holds the token's nonce: a run of this job issued
// it. A token that fails either is ErrBadCallbackToken, nothing written;
// without a key secret, ErrNoKeySecret.
func (s *Store) Complete(ctx context.Context, token, payload string) (Record, error) {
	id, name, nonce, err := s.ParseCallbackToken(token)
	if err != nil {
		return Record{}, err
	}
	return s.signal(ctx, id, name, nonce, payload)
}

// signal is Signal, and with a nonce Complete: the job must hold it as its
// token for name (TokenStep), read and in the write's condition.
func (s *Store) signal(ctx context.Context, id, name, nonce, payload string) (Record, error) {
	if err := CheckStep(Record{}, WaitStep(name), payload); err != nil {
		return Record{}, err
	}
	if nonce != "" {
		b, _ := json.Marshal(nonce) // as the run's step keeps it
		nonce = string(b)
	}
	sig, wait := SignalStep(name), WaitStep(name)
	steps := expression.Name(AttrSteps)
	st := expression.Name(AttrState)
	active := st.Equal(expression.Value(Enqueued)).Or(st.Equal(expression.Value(Scheduled))).
		Or(st.Equal(expression.Value(Processing))).Or(st.Equal(expression.Value(AwaitingContinuation)))
	const tries = 8
	for range tries {
		cur, err := s.Get(ctx, id)
		if err != nil {
			return Record{}, err
		}
		if nonce != "" && cur.Steps[TokenStep(name)] != nonce {
			return Record{}, ErrBadCallbackToken // not a token this job's run issued
		}
		if done, err := s.signalRefused(cur, id, name, payload); done || err != nil {
			return cur, err
		}
		if err := CheckStep(cur, sig, payload); err != nil {
			return Record{}, err
		}
		// The wait's end, written once, is compared here as a number
		// (signalRefused): the write is conditional on it as read, or on
		// no wait yet. A comparison of the strings in the condition took
		// an end of more than 13 digits for one already past.
		inTime := stepPath(wait).AttributeNotExists()
		if end, ok := cur.Steps[wait]; ok {
			inTime = stepPath(wait).Equal(expression.Value(end))
		}
		cond := isJob(id).And(active).And(inTime)
		if nonce != "" {
			cond = cond.And(stepPath(TokenStep(name)).Equal(expression.Value(nonce)))
		}
		var upd expression.UpdateBuilder
		if cur.Steps == nil {
			cond = cond.And(steps.AttributeNotExists())
			upd = expression.Set(steps, expression.Value(stepsValue(map[string]string{sig: payload})))
		} else {
			cond = cond.And(stepPath(sig).AttributeNotExists()).
				And(expression.Size(steps).Equal(expression.Value(len(cur.Steps))))
			upd = expression.Set(stepPath(sig), expression.Value(payload))
		}
		rec, err := s.updateByID(ctx, id, cond, upd)
		var nc *NotClaimableError
		if errors.As(err, &nc) {
			if done, err := s.signalRefused(nc.Current, id, name, payload); done || err != nil {
				return nc.Current, err
			}
			continue // a step or a signal written meanwhile: read again
		}
		return rec, err
	}
	return Record{}, ErrContention
}

// signalRefused decides a signal of name with payload to cur before any
// write: done with the record as it is (the same signal sent again), a
// *SignalRefusedError, or neither (go on).
func (s *Store) signalRefused(cur Record, id, name, payload string) (done bool, err error) {
	sig := SignalStep(name)
	refused := &SignalRefusedError{JobID: id, Name: name, State: cur.State}
	switch {
	case cur.Steps[sig] == payload:
		// The same signal again: a caller's retry after an error (its
		// wake or send failed past the SDK's retries, or its reply was
		// lost past them), or the SDK's resend of its applied write. It
		// reads as the success it was, even once the job took it and
		// ended (a webhook's retry is told its signal landed, not that
		// the job ended without it), and the caller wakes the job if it
		// still sleeps in the wait.
		return true, nil
	case cur.State.Terminal():
		refused.Err = ErrJobEnded
	case cur.Steps[sig] == TimedOut:
		refused.Err = ErrSignalTooLate // the wait's run recorded its timeout first
	case cur.Steps[sig] != "":
		refused.Err = ErrSignalSent
	default:
		// Not by the sender's clock: a wait's end passed by that clock
		// is not a timeout until the run that meets the end records it
		// (RecordTimeout), and a signal that lands before that is the
		// wait's payload. A producer whose clock ran two hours ahead had
		// every signal to a wait of an hour refused (the doc attack).
		return false, nil
	}
	return false, refused
}

// TimedOut is the value a wait's timeout records in its signal's slot
// (SignalStep): not JSON, so no payload is ever it. A signal that comes
// after it is refused (ErrSignalTooLate).
const TimedOut = "\x00timed out"

// TimedOutWaits are the names of r's waits that timed out.
func (r Record) TimedOutWaits() []string { return timedOutWaits(r) }

// timedOutWaits are the names of rec's waits that timed out.
func timedOutWaits(rec Record) []string {
	var out []string
	for k, v := range rec.Steps {
		if name, ok := strings.CutPrefix(k, signalStep); ok && v == TimedOut {
			out = append(out, name)
		}
	}
	return out
}

// ReopenTimedOutWaits opens again, for the run that claimed rec (marked
// ReopenWaits by a requeue), the waits that timed out before: their ends
// and TimedOut marks are removed with the mark, so the run meets each wait
// afresh (a new end, now plus its timeout) and a late approver's signal
// is taken; a job with none has its mark removed. Before, a requeued job
// kept its timeouts and failed again at once. One UpdateItem fenced as a
// step's record is; a resend of an applied write reads as done.
func (s *Store) ReopenTimedOutWaits(ctx context.Context, rec Record) (Record, error) {
	upd := expression.Remove(expression.Name(AttrReopenWaits))
	cond := isJob(rec.ID).And(expression.Name(AttrToken).Equal(expression.Value(rec.Token))).
		And(expression.Name(AttrState).Equal(expression.Value(string(Processing))))
	for _, name := range timedOutWaits(rec) {
		upd = upd.Remove(stepPath(SignalStep(name))).Remove(stepPath(WaitStep(name)))
		cond = cond.And(stepPath(SignalStep(name)).Equal(expression.Value(TimedOut)))
	}
	out, err := s.updateByID(ctx, rec.ID, cond, upd)
	var nc *NotClaimableError
	switch {
	case errors.As(err, &nc) && nc.Current.Token == rec.Token && nc.Current.State == Processing && !nc.Current.ReopenWaits:
		return nc.Current, nil // this very write, applied before
	case errors.As(err, &nc):
		return Record{}, fmt.Errorf("%w (job %s, token %d)", ErrFenced, rec.ID, rec.Token)
	}
	return out, err
}

// RecordTimeout decides a wait's timeout for the run that claimed rec, in
// one conditional UpdateItem: it records TimedOut as signal name's slot
// unless a signal is there (a signal in flight at the wait's end that
// landed first). payload is that signal's ("" when the timeout won). The
// slot decides for both sides: a signal landing after it is refused as
// too late, and never accepted while the run fails on the timeout. A
// run that lost its claim gets ErrFenced; a resend of an applied write
// (its reply lost) reads as the timeout it recorded.
func (s *Store) RecordTimeout(ctx context.Context, rec Record, name string) (payload string, err error) {
	sig := stepPath(SignalStep(name))
	cond := isJob(rec.ID).And(expression.Name(AttrToken).Equal(expression.Value(rec.Token))).
		And(expression.Name(AttrState).Equal(expression.Value(string(Processing)))).
		And(expression.Name(AttrSteps).AttributeExists()).And(sig.AttributeNotExists())
	_, err = s.updateByID(ctx, rec.ID, cond, expression.Set(sig, expression.Value(TimedOut)))
	var nc *NotClaimableError
	switch {
	case errors.As(err, &nc) && nc.Current.Token == rec.Token && nc.Current.Steps[SignalStep(name)] == TimedOut:
		return "", nil // this very write, applied before
	case errors.As(err, &nc) && nc.Current.Token == rec.Token && nc.Current.Steps[SignalStep(name)] != "":
		return nc.Current.Steps[SignalStep(name)], nil // the signal landed first
	case errors.As(err, &nc):
		return "", fmt.Errorf("%w (job %s, token %d)", ErrFenced, rec.ID, rec.Token)
	}
	return "", err
}

// RecordTimeouts is RecordTimeout of a wait for any of names (a
// WaitForAny's end): one UpdateItem recording TimedOut in every name's
// signal slot, conditional on none holding a signal. landed is the
// signals (by name) that landed first, none when the timeout won; the
// slots decide for every sender as RecordTimeout's slot does. A run that
// lost its claim gets ErrFenced; a resend of an applied write reads as
// the timeout it recorded.
func (s *Store) RecordTimeouts(ctx context.Context, rec Record, names []string) (landed map[string]string, err error) {
	cond := isJob(rec.ID).And(expression.Name(AttrToken).Equal(expression.Value(rec.Token))).
		And(expression.Name(AttrState).Equal(expression.Value(string(Processing)))).
		And(expression.Name(AttrSteps).AttributeExists())
	var upd expression.UpdateBuilder
	for _, name := range names {
		sig := stepPath(SignalStep(name))
		cond = cond.And(sig.AttributeNotExists())
		upd = upd.Set(sig, expression.Value(TimedOut))
	}
	_, err = s.updateByID(ctx, rec.ID, cond, upd)
	var nc *NotClaimableError
	if !errors.As(err, &nc) {
		return nil, err
	}
	if nc.Current.Token != rec.Token {
		return nil, fmt.Errorf("%w (job %s, token %d)", ErrFenced, rec.ID, rec.Token)
	}
	landed = map[string]string{}
	for _, name := range names {
		if p := nc.Current.Steps[SignalStep(name)]; p != "" && p != TimedOut {
			landed[name] = p
		}
	}
	if len(landed) == 0 && nc.Current.Steps[SignalStep(names[0])] != TimedOut {
		return nil, fmt.Errorf("%w (job %s, token %d)", ErrFenced, rec.ID, rec.Token)
	}
	return landed, nil // the signals that landed first, or this very write applied before
}

// Waiting reports whether rec sleeps in a wait for signal name: Scheduled
// for the wait's end, whether or not that end passed by this process's
// clock (a sender's clock ahead of the workers' must still wake it); or
// already made due by a wake whose send may have failed (a caller's retry
// sends it). Not a job Scheduled for another time (a RetryAfter after the
// wait took its signal): a signal's retry must not run it early.
func (s *Store) Waiting(rec Record, name string) bool {
	end, err := strconv.ParseInt(rec.Steps[WaitStep(name)], 10, 64)
	return err == nil && rec.State == Scheduled && (rec.RunAt == end || rec.RunAt <= s.now().UnixMilli())
}

// Signalled reports whether rec sleeps in a wait (Waiting) whose signal
// is recorded: a job to wake now (its signal came while the run that
// began the wait was ending, and that run could not wake it).
func (s *Store) Signalled(rec Record) bool {
	for k := range rec.Steps {
		if name, ok := strings.CutPrefix(k, waitStep); ok && rec.Steps[SignalStep(name)] != "" && s.Waiting(rec, name) {
			return true
		}
	}
	return false
}

// Wake makes rec, Scheduled for rec.RunAt, due now: one UpdateItem
// conditional on the record being still Scheduled for that time (a job
// that moved on is left alone: ok false). The caller sends its message.
// Never later than rec.RunAt: a caller whose clock runs ahead of the
// workers' leaves the time as it is, and the worker that takes the
// message wakes the job by its own clock (a wake to the caller's now,
// hours ahead, had the job carried forward until then).
func (s *Store) Wake(ctx context.Context, rec Record) (Record, bool, error) {
	cond := scheduled(rec.ID).And(expression.Name(AttrRunAt).Equal(expression.Value(rec.RunAt)))
	now := s.now().UnixMilli()
	upd := expression.Set(expression.Name(AttrRunAt), expression.Value(min(now, rec.RunAt))).
		Set(expression.Name(AttrUpdatedAt), expression.Value(now))
	out, err := s.updateByID(ctx, rec.ID, cond, upd)
	var nc *NotClaimableError
	if errors.As(err, &nc) {
		return nc.Current, false, nil
	}
	return out, err == nil, err
}

// ErrNoKeySecret: a callback token needs the deployment's key secret
// (Options.KeySecret, NEXJOB_KEY_SECRET): without it a token could be
// made by anyone who knows the job's id.
var ErrNoKeySecret = errors.New("nexjob: callback tokens need a key secret (NEXJOB_KEY_SECRET)")

// ErrBadCallbackToken: a token that no run of this deployment's jobs
// issued (malformed, its MAC does not match under the key secret, or its
// job does not hold its nonce).
var ErrBadCallbackToken = errors.New("nexjob: not a callback token of this deployment")

// callbackPrefix starts every callback token (its format's version). A
// token of the first version ("njcb1.", a MAC of the job and the name
// alone, so anyone holding the key secret could make one for any job) is
// refused.
const callbackPrefix = "njcb2."

// CallbackToken is the token of job id's signal name, for the nonce a run
// of the job recorded as TokenStep(name): the job, the name and the nonce,
// and their MAC under the key secret (HMAC-SHA256, 128 bits). No token can
// be made without both the secret and the job's nonce, nor altered. No
// secret: ErrNoKeySecret.
func (s *Store) CallbackToken(id, name, nonce string) (string, error) {
	if len(s.secret) == 0 {
		return "", ErrNoKeySecret
	}
	body := id + "\x00" + name + "\x00" + nonce
	return callbackPrefix + base64.RawURLEncoding.EncodeToString([]byte(body)) + "." + s.callbackMAC(body), nil
}

// ParseCallbackToken checks token's MAC and returns its job, signal name
// and nonce: ErrBadCallbackToken when it does not hold, ErrNoKeySecret
// with no secret. Whether the job holds the nonce is Complete's to check.
func (s *Store) ParseCallbackToken(token string) (id, name, nonce string, err error) {
	if len(s.secret) == 0 {
		return "", "", "", ErrNoKeySecret
	}
	rest, found := strings.CutPrefix(token, callbackPrefix)
	body, mac, ok := strings.Cut(rest, ".")
	raw, err := base64.RawURLEncoding.Strict().DecodeString(body) // one text per token: no slack in the last bits
	if !found || !ok || err != nil || !hmac.Equal([]byte(s.callbackMAC(string(raw))), []byte(mac)) {
		return "", "", "", ErrBadCallbackToken
	}
	id, rest, ok1 := strings.Cut(string(raw), "\x00") // an id and a nonce hold no NUL; a name may
	i := strings.LastIndexByte(rest, 0)
	if !ok1 || i < 0 || i == len(rest)-1 {
		return "", "", "", ErrBadCallbackToken
	}
	return id, rest[:i], rest[i+1:], nil
}

// callbackMAC is the token's MAC: HMAC-SHA256 of its body under a key of
// its own, derived from the secret (HMAC(secret, its label)), never under
// the secret itself: idempotency keys are hashed under the secret and
// their hashes are shown (the dashboard, nexjob get), so a MAC under the
// same key was a key hash anyone could have made be shown (a job keyed
// "callback\x00<id>\x00<name>" forged the token).
func (s *Store) callbackMAC(body string) string {
	k := hmac.New(sha256.New, s.secret)
	k.Write([]byte("nexjob callback token key, v2"))
	return hashKey(k.Sum(nil), body)
}
