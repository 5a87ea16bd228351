package enqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// refund has the same key space as payment but another kind.
type refund struct {
	OrderID string `json:"orderId"`
}

func (refund) Kind() string { return "refund" }

// invoiceRun carries its kind's defaults (enqueue.KindDefaults).
type invoiceRun struct {
	Month string `json:"month"`
}

func (invoiceRun) Kind() string { return "invoice-run" }
func (invoiceRun) JobDefaults() enqueue.Defaults {
	return enqueue.Defaults{MaxAttempts: 2, DuplicatePolicy: enqueue.RejectAlways, PayloadMismatch: enqueue.RejectPayload}
}

// TestPayloadFingerprint (issue 12, item 4): the record keeps a hash of
// the args; a key re-used with other args is a duplicate by default and a
// *PayloadMismatchError with RejectPayload; a key held by another kind is
// a *KeyKindError; Result names the holder's kind.
func TestPayloadFingerprint(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	first, err := c.Enqueue(ctx, payment{OrderID: "7", Cents: 100}, &enqueue.Opts{IdempotencyKey: "pay-7"})
	if err != nil {
		t.Fatal(err)
	}
	if first.Kind != "payment" {
		t.Fatalf("Result.Kind %q", first.Kind)
	}
	rec := e.Get(t, first.ID)
	if rec.ArgsHash != ledger.ArgsHash("payment", `{"orderId":"7","cents":100}`) || len(rec.ArgsHash) != 22 {
		t.Fatalf("args hash %q", rec.ArgsHash)
	}
	// Same args, RejectPayload: a true retry, a duplicate.
	again, err := c.Enqueue(ctx, payment{OrderID: "7", Cents: 100}, &enqueue.Opts{IdempotencyKey: "pay-7", PayloadMismatch: enqueue.RejectPayload})
	if err != nil || !again.Duplicate || again.ID != first.ID || again.Kind != "payment" {
		t.Fatalf("retry with the same args: %+v %v", again, err)
	}
	// Other args: ignored by default (NexJob's behaviour) …
	if res, err := c.Enqueue(ctx, payment{OrderID: "7", Cents: 999}, &enqueue.Opts{IdempotencyKey: "pay-7"}); err != nil || !res.Duplicate {
		t.Fatalf("other args, default: %+v %v", res, err)
	}
	// … rejected when asked.
	_, err = c.Enqueue(ctx, payment{OrderID: "7", Cents: 999}, &enqueue.Opts{IdempotencyKey: "pay-7", PayloadMismatch: enqueue.RejectPayload})
	var pm *enqueue.PayloadMismatchError
	if !errors.As(err, &pm) || pm.ExistingJobID != first.ID {
		t.Fatalf("other args, RejectPayload: %v", err)
	}
	// Another kind holding the key is reported, whatever the payload policy.
	_, err = c.Enqueue(ctx, refund{OrderID: "7"}, &enqueue.Opts{IdempotencyKey: "pay-7"})
	var kk *enqueue.KeyKindError
	if !errors.As(err, &kk) || kk.ExistingKind != "payment" || kk.Kind != "refund" {
		t.Fatalf("key held by another kind: %v", err)
	}
	if recs := e.Records(t); len(recs) != 1 {
		t.Fatalf("%d records, want the one job: refusals must write nothing", len(recs))
	}
	checkMessages(t, e, 1)
	if _, err := c.Enqueue(ctx, payment{}, &enqueue.Opts{IdempotencyKey: "x", PayloadMismatch: 7}); !errors.Is(err, enqueue.ErrInvalidInput) {
		t.Fatalf("unknown PayloadMismatch: %v", err)
	}
}

// TestKindDefaults (issue 12, item 5): the args type's JobDefaults fill
// what the Opts leave unset, and Opts override them.
func TestKindDefaults(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	res, err := c.Enqueue(ctx, invoiceRun{Month: "2026-11"}, &enqueue.Opts{IdempotencyKey: "inv-2026-11"})
	if err != nil {
		t.Fatal(err)
	}
	rec := e.Get(t, res.ID)
	if rec.MaxAttempts != 2 || rec.Policy != "RejectAlways" {
		t.Fatalf("defaults not applied: maxAttempts %d, policy %s", rec.MaxAttempts, rec.Policy)
	}
	// The kind's RejectPayload default.
	var pm *enqueue.PayloadMismatchError
	if _, err := c.Enqueue(ctx, invoiceRun{Month: "2026-12"}, &enqueue.Opts{IdempotencyKey: "inv-2026-11"}); !errors.As(err, &pm) {
		t.Fatalf("the kind's RejectPayload default: %v", err)
	}
	other, err := c.Enqueue(ctx, invoiceRun{Month: "2026-12"}, &enqueue.Opts{IdempotencyKey: "inv-2026-12", MaxAttempts: 5, DuplicatePolicy: enqueue.RejectIfFailed})
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.Get(t, other.ID); rec.MaxAttempts != 5 || rec.Policy != "RejectIfFailed" {
		t.Fatalf("opts did not override the defaults: %d %s", rec.MaxAttempts, rec.Policy)
	}
	// NoKindDefaults: the zero fields mean the package's defaults.
	plain, err := c.Enqueue(ctx, invoiceRun{Month: "2027-01"}, &enqueue.Opts{IdempotencyKey: "inv-2027-01", NoKindDefaults: true})
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.Get(t, plain.ID); rec.MaxAttempts != enqueue.DefaultMaxAttempts || rec.Policy != "AllowAfterFailed" {
		t.Fatalf("NoKindDefaults: maxAttempts %d, policy %s", rec.MaxAttempts, rec.Policy)
	}
	if _, err := c.Enqueue(ctx, invoiceRun{Month: "2027-02"}, &enqueue.Opts{IdempotencyKey: "inv-2027-01", NoKindDefaults: true}); err != nil {
		t.Fatalf("NoKindDefaults: IgnorePayload, not the kind's RejectPayload: %v", err)
	}
}

// TestKeyAdmin (issue 12, item 6): Holder, WouldAccept and ReleaseKey
// through each state a key's holder can be in.
func TestKeyAdmin(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	if _, err := c.Holder(ctx, "refund-9"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("holder of a free key: %v", err)
	}
	d, err := c.WouldAccept(ctx, "refund-9", enqueue.RejectAlways)
	if err != nil || d.Outcome != ledger.WouldCreate || d.Holder != nil {
		t.Fatalf("free key: %+v %v", d, err)
	}
	res := stage(t, c, "refund-9", ledger.Enqueued, time.Time{})
	if h, err := c.Holder(ctx, "refund-9"); err != nil || h.ID != res.ID || h.State != ledger.Enqueued {
		t.Fatalf("holder: %+v %v", h, err)
	}
	if d, _ := c.WouldAccept(ctx, "refund-9", enqueue.AllowAfterFailed); d.Outcome != ledger.WouldDuplicate || d.Holder.ID != res.ID {
		t.Fatalf("active holder: %+v", d)
	}
	if _, err := c.ReleaseKey(ctx, "refund-9"); !errors.Is(err, ledger.ErrKeyHeldByActiveJob) {
		t.Fatalf("release of an active key: %v", err)
	}
	// Cancelled (Failed): protected by RejectIfFailed, not by AllowAfterFailed.
	if _, err := c.Cancel(ctx, res.ID, "", time.Hour); err != nil {
		t.Fatal(err)
	}
	for policy, want := range map[enqueue.DuplicatePolicy]ledger.Outcome{
		enqueue.AllowAfterFailed: ledger.WouldCreate, enqueue.RejectIfFailed: ledger.WouldReject, enqueue.RejectAlways: ledger.WouldReject,
	} {
		if d, err := c.WouldAccept(ctx, "refund-9", policy); err != nil || d.Outcome != want {
			t.Fatalf("%s over a Failed holder: %+v %v; want %s", policy, d, err, want)
		}
	}
	if recs := e.Records(t); len(recs) != 1 {
		t.Fatalf("WouldAccept wrote: %d records", len(recs))
	}
	// Release keeps the record, under its id, and frees the key for any policy.
	rel, err := c.ReleaseKey(ctx, "refund-9")
	if err != nil || rel.ID != res.ID || rel.KeyHash != "" {
		t.Fatalf("release: %+v %v", rel, err)
	}
	if got := e.Get(t, res.ID); got.State != ledger.Failed || got.KeyHash != "" {
		t.Fatalf("released record %+v", got)
	}
	if _, err := c.ReleaseKey(ctx, "refund-9"); !errors.Is(err, ledger.ErrKeyFree) {
		t.Fatalf("second release: %v", err)
	}
	next, err := c.Enqueue(ctx, payment{OrderID: "9"}, &enqueue.Opts{IdempotencyKey: "refund-9", DuplicatePolicy: enqueue.RejectAlways})
	if err != nil || next.Duplicate || next.ID == res.ID {
		t.Fatalf("enqueue after the release: %+v %v", next, err)
	}
	// The released job can still be requeued, without its key, and run:
	// every update of it now lands on its own record, its key's second.
	e.Purge(t, e.QueueURL) // the cancelled job's first message would wait out a visibility timeout
	if _, err := c.Requeue(ctx, res.ID); err != nil {
		t.Fatalf("requeue of the released job: %v", err)
	}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[payment](func(context.Context, *handler.Job[payment]) error { return nil }), nil)
	e.Drain(t, e.Handler(t, reg, &handler.Options{Logger: quietLog}))
	e.RequireState(t, res.ID, ledger.Succeeded)
	if _, err := c.Holder(ctx, ""); !errors.Is(err, enqueue.ErrInvalidInput) {
		t.Fatalf("empty key: %v", err)
	}
}

// TestReleaseKeyWhenReplyIsLost: the release's transaction is applied, its
// reply lost, the SDK resends it and it fails: ReleaseKey still reports
// the release. Throttled past the retries, it is an error and the key
// stays held.
func TestReleaseKeyWhenReplyIsLost(t *testing.T) {
	t.Parallel()
	for _, f := range []faults.Fault{faults.LostReply, faults.Throttle} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			c, ft := faultyClient(t, e)
			ctx := context.Background()
			res := stage(t, c, "gift-3", ledger.Succeeded, time.Time{})
			times := 1
			if f == faults.Throttle {
				times = faults.Attempts
			}
			h := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: f, Times: times})
			rel, err := c.ReleaseKey(ctx, "gift-3")
			if h.Fired() != times {
				t.Fatalf("fault fired %d times", h.Fired())
			}
			holder, herr := c.Holder(ctx, "gift-3")
			if f == faults.Throttle {
				if err == nil || herr != nil || holder.ID != res.ID {
					t.Fatalf("throttled release: %v; holder %+v %v; want an error and the key still held", err, holder, herr)
				}
				return
			}
			if err != nil || rel.ID != res.ID || !errors.Is(herr, ledger.ErrNotFound) {
				t.Fatalf("release after a lost reply: %+v %v; holder %v", rel, err, herr)
			}
		})
	}
}

// welcome keys itself by its user (River's UniqueOpts{ByArgs}, one key
// per user) and keeps one welcome for good.
type welcome struct{ UserID string }

func (welcome) Kind() string { return "welcome" }
func (w welcome) JobDefaults() enqueue.Defaults {
	return enqueue.Defaults{IdempotencyKey: "welcome/" + w.UserID, DuplicatePolicy: enqueue.RejectAlways}
}

// digest is keyed by its whole args.
type digest struct{ Day, Team string }

func (digest) Kind() string                  { return "digest" }
func (digest) JobDefaults() enqueue.Defaults { return enqueue.Defaults{KeyByArgs: true} }

// TestKindKeys (issue 30 item 8): a kind's key comes from its args
// (Defaults.IdempotencyKey, or KeyByArgs for the whole args); a policy
// with no key to apply to is refused, nothing written (before: two
// Welcome jobs ran under RejectAlways, the policy silently ignored).
func TestKindKeys(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	c, ctx := e.Client, context.Background()
	first, err := c.Enqueue(ctx, welcome{UserID: "u1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Enqueue(ctx, welcome{UserID: "u1"}, nil)
	if err != nil || !again.Duplicate || again.ID != first.ID {
		t.Fatalf("a second welcome of u1: %+v %v; want the first, a duplicate", again, err)
	}
	if other, err := c.Enqueue(ctx, welcome{UserID: "u2"}, nil); err != nil || other.Duplicate {
		t.Fatalf("u2's welcome: %+v %v; want a new job", other, err)
	}
	d1, err := c.Enqueue(ctx, digest{Day: "2026-12-06", Team: "a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d2, err := c.Enqueue(ctx, digest{Day: "2026-12-06", Team: "a"}, nil); err != nil || d2.ID != d1.ID {
		t.Fatalf("the same digest args: %+v %v; want the same job", d2, err)
	}
	if d3, err := c.Enqueue(ctx, digest{Day: "2026-12-06", Team: "b"}, nil); err != nil || d3.ID == d1.ID {
		t.Fatalf("other digest args: %+v %v; want another job", d3, err)
	}
	before := len(e.Scan(t))
	var in *enqueue.InputError
	if _, err := c.Enqueue(ctx, invoiceRun{Month: "2027-01"}, nil); !errors.As(err, &in) || in.Field != "DuplicatePolicy" {
		t.Fatalf("RejectAlways (the kind's default) with no key: %v, want an *InputError on DuplicatePolicy", err)
	}
	if _, err := c.Enqueue(ctx, digest{Day: "x"}, &enqueue.Opts{DuplicatePolicy: enqueue.RejectIfFailed, NoKindDefaults: true}); !errors.As(err, &in) {
		t.Fatalf("RejectIfFailed with no key: %v, want an *InputError", err)
	}
	if after := len(e.Scan(t)); after != before {
		t.Fatalf("a refused enqueue wrote %d items", after-before)
	}
}
