package handler_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Args over 16 KB in S3 (durable-jobs.md, "Large values in S3."): "A
// job's args over 16 KB (ledger.MaxInlineArgsBytes), up to 32 MB, go to
// the bucket too, under args/ (through Enqueue, EnqueueMany and
// EnqueueChild, not debounced: a transaction, a flow, a continuation or
// a debounced job keeps them on its record, up to 350 KB,
// ledger.MaxArgsBytes), written before the record that names them; the
// worker reads them at each run (one GetObject), checked against the
// record's hash of its args ..., and writes an object a year old again".

// The edges: 16 KB on the record, 16 KB + 1 an object, 32 MB an object
// the worker gets whole, 32 MB + 1 an *InputError.
func TestS3AttackArgsSizes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	var sn s3aSeen
	h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), true, nil)
	for _, tc := range []struct {
		tag  string
		size int
		blob bool
	}{
		{"16k", ledger.MaxInlineArgsBytes, false},
		{"16k+1", ledger.MaxInlineArgsBytes + 1, true},
		{"32m", ledger.MaxBlobStepBytes, true},
	} {
		a := s3aArgsOfSize(tc.tag, tc.size)
		res, err := r.e.Client.Enqueue(ctx, a, nil)
		if err != nil {
			t.Fatalf("args of %d bytes: %v", tc.size, err)
		}
		rec := r.e.Get(t, res.ID)
		if tc.blob != (rec.ArgsBlob != "") || (tc.blob && rec.Args != "") || (!tc.blob && len(rec.Args) != tc.size) {
			t.Fatalf("args of %d bytes: the record keeps %d bytes and names %q; want in the bucket: %v", tc.size, len(rec.Args), rec.ArgsBlob, tc.blob)
		}
		r.e.Drain(t, h)
		if got := sn.of(tc.tag); r.e.Get(t, res.ID).State != ledger.Succeeded || len(got) != 1 || got[0] != len(a.Text) {
			t.Fatalf("args of %d bytes: the worker got %v bytes of text, want one run with %d", tc.size, got, len(a.Text))
		}
	}
	_, err := r.e.Client.Enqueue(ctx, s3aArgsOfSize("32m+1", ledger.MaxBlobStepBytes+1), nil)
	var in *enqueue.InputError
	if !errors.As(err, &in) || in.Field != "args" {
		t.Fatalf("args of 32 MB + 1: %v; want an *InputError on args", err)
	}
}

// Faults around the args object: a lost reply to its PutObject and to the
// record's PutItem (one job, run with its args), a throttle of the
// PutObject past the SDK's retries (an error, no job), a throttle of the
// worker's GetObject past the SDK's retries (the run fails and is
// retried; the worker never runs with anything else), a deleted object
// (never run; ErrBlobMissing).
func TestS3AttackArgsUnderFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	big := func(tag string) s3aArgs { return s3aArgsOfSize(tag, 100_000) }
	t.Run("lost replies to the object and the record", func(t *testing.T) {
		t.Parallel()
		r := newS3Rig(t, true)
		var sn s3aSeen
		h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), true, nil)
		put := r.sf.add(&s3Rule{method: "PUT", prefix: "args/", fault: faults.LostReply})
		ins := r.ft.Add(faults.Rule{Op: "DynamoDB.PutItem", Match: func(b []byte) bool { return strings.Contains(string(b), "argsBlob") }, Fault: faults.LostReply})
		res, err := r.e.Client.Enqueue(ctx, big("lost"), nil)
		if err != nil {
			t.Fatalf("enqueue with lost replies (object %d, record %d): %v", r.sf.fired(put), ins.Fired(), err)
		}
		r.e.Drain(t, h)
		jobs := 0
		for _, j := range r.e.Scan(t) {
			if j.Kind == "s3a-args" {
				jobs++
			}
		}
		if got := sn.of("lost"); jobs != 1 || len(got) != 1 || got[0] != len(big("lost").Text) || r.e.Get(t, res.ID).State != ledger.Succeeded || r.sf.fired(put) != 1 || ins.Fired() != 1 {
			t.Fatalf("after lost replies (object %d, record %d): %d jobs, runs %v", r.sf.fired(put), ins.Fired(), jobs, got)
		}
	})
	t.Run("the object's write throttled past the SDK's retries", func(t *testing.T) {
		t.Parallel()
		r := newS3Rig(t, true)
		r.sf.add(&s3Rule{method: "PUT", prefix: "args/", fault: faults.Throttle, times: faults.Attempts})
		_, err := r.e.Client.Enqueue(ctx, big("thr"), nil)
		if err == nil {
			t.Fatalf("enqueue with its args' PutObject throttled past the SDK's retries: no error")
		}
		for _, j := range r.e.Scan(t) {
			if j.Kind == "s3a-args" {
				t.Fatalf("a refused enqueue left job %s (%s), naming %q", j.ID, j.State, j.ArgsBlob)
			}
		}
	})
	t.Run("the worker's read throttled past the SDK's retries", func(t *testing.T) {
		t.Parallel()
		r := newS3Rig(t, true)
		var sn s3aSeen
		h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), true, nil)
		res, err := r.e.Client.Enqueue(ctx, big("get"), nil)
		if err != nil {
			t.Fatal(err)
		}
		get := r.sf.add(&s3Rule{method: "GET", prefix: "args/", fault: faults.Throttle, times: faults.Attempts})
		r.e.Drain(t, h)
		rec := r.e.Get(t, res.ID)
		if got := sn.of("get"); rec.State != ledger.Succeeded || rec.Attempt != 2 || len(got) != 1 || got[0] != len(big("get").Text) || r.sf.fired(get) != faults.Attempts {
			t.Fatalf("after a throttled read of the args (fired %d): %s at attempt %d (%s), runs %v; want the run failed, retried and run once with its args", r.sf.fired(get), rec.State, rec.Attempt, rec.LastError, got)
		}
	})
	t.Run("the object deleted", func(t *testing.T) {
		t.Parallel()
		r := newS3Rig(t, true)
		var sn s3aSeen
		h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), true, nil)
		res, err := r.e.Client.Enqueue(ctx, big("del"), &enqueue.Opts{MaxAttempts: 2})
		if err != nil {
			t.Fatal(err)
		}
		r.del(t, r.e.Get(t, res.ID).ArgsBlob)
		r.e.Drain(t, h)
		rec := r.e.Get(t, res.ID)
		if got := sn.of("del"); len(got) != 0 || rec.State != ledger.Failed || !strings.Contains(rec.LastError, ledger.ErrBlobMissing.Error()) {
			t.Fatalf("args object deleted: the worker ran %v, job %s (%s); want never run, Failed with ErrBlobMissing", got, rec.State, rec.LastError)
		}
		if _, err := r.e.Client.Store().ArgsOf(ctx, rec, false); !errors.Is(err, ledger.ErrBlobMissing) {
			t.Fatalf("ArgsOf of a job whose args object is gone: %v; want ErrBlobMissing", err)
		}
	})
	t.Run("a worker with no blob bucket", func(t *testing.T) {
		t.Parallel()
		r := newS3Rig(t, true)
		var sn s3aSeen
		h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), false, nil)
		res, err := r.e.Client.Enqueue(ctx, big("nob"), &enqueue.Opts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		r.e.Drain(t, h)
		rec := r.e.Get(t, res.ID)
		if got := sn.of("nob"); len(got) != 0 || rec.State == ledger.Succeeded {
			t.Fatalf("a worker with no blob bucket: ran %v, job %s (%s); want never run with other args", got, rec.State, rec.LastError)
		}
		if _, err := r.e.Client.Store().ArgsOf(ctx, rec, false); err != nil {
			t.Fatalf("the args after a worker with no bucket failed the job: %v", err)
		}
	})
}

// Keys with large args: the same args are a duplicate; other args (large
// or small) under RejectPayload a *PayloadMismatchError; ReplaceEnded
// puts a new job with other args (small, then large) in the ended one's
// place, and each runs with its own.
func TestS3AttackKeysWithLargeArgs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	var sn s3aSeen
	h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), true, nil)
	a := s3aArgsOfSize("k1", 50_000)
	o := &enqueue.Opts{IdempotencyKey: "s3a-key", PayloadMismatch: enqueue.RejectPayload}
	first, err := r.e.Client.Enqueue(ctx, a, o)
	if err != nil {
		t.Fatal(err)
	}
	dup, err := r.e.Client.Enqueue(ctx, a, o)
	if err != nil || !dup.Duplicate || dup.ID != first.ID {
		t.Fatalf("the same large args under the key: %+v, %v; want the duplicate", dup, err)
	}
	other := a
	other.Text = other.Text[:len(other.Text)-1] + "b"
	var pm *enqueue.PayloadMismatchError
	if _, err := r.e.Client.Enqueue(ctx, other, o); !errors.As(err, &pm) {
		t.Fatalf("other large args under the key with RejectPayload: %v; want a *PayloadMismatchError", err)
	}
	if _, err := r.e.Client.Enqueue(ctx, s3aArgs{Tag: "k1", Text: "small"}, o); !errors.As(err, &pm) {
		t.Fatalf("small args under a key held with large ones, RejectPayload: %v; want a *PayloadMismatchError", err)
	}
	r.e.Drain(t, h)
	if got := sn.of("k1"); len(got) != 1 || got[0] != len(a.Text) {
		t.Fatalf("the keyed job ran with %v bytes of text, want once with %d", got, len(a.Text))
	}
	// ReplaceEnded: small args in the ended large-args job's place, then
	// large ones in the small one's.
	ro := &enqueue.Opts{IdempotencyKey: "s3a-key", ReplaceEnded: true}
	small, err := r.e.Client.Enqueue(ctx, s3aArgs{Tag: "k2", Text: "small"}, ro)
	if err != nil || small.Duplicate {
		t.Fatalf("ReplaceEnded with small args: %+v, %v", small, err)
	}
	if rec := r.e.Get(t, small.ID); rec.ArgsBlob != "" {
		t.Fatalf("ReplaceEnded with small args: the record still names %q", rec.ArgsBlob)
	}
	r.e.Drain(t, h)
	b := s3aArgsOfSize("k3", 80_000)
	large, err := r.e.Client.Enqueue(ctx, b, ro)
	if err != nil || large.Duplicate {
		t.Fatalf("ReplaceEnded with large args: %+v, %v", large, err)
	}
	r.e.Drain(t, h)
	if got2, got3 := sn.of("k2"), sn.of("k3"); len(got2) != 1 || got2[0] != len("small") || len(got3) != 1 || got3[0] != len(b.Text) {
		t.Fatalf("after ReplaceEnded: the small job ran with %v bytes, the large one with %v (want [5] and [%d])", got2, got3, len(b.Text))
	}
	if rec := r.e.Get(t, large.ID); rec.State != ledger.Succeeded || rec.ArgsBlob == "" || rec.ArgsHash != ledger.ArgsHash("s3a-args", mustJSON(t, b)) {
		t.Fatalf("the large replacement: %s, object %q, hash %q", rec.State, rec.ArgsBlob, rec.ArgsHash)
	}
}

// EnqueueMany with large and small args mixed (and a debounced large
// item, which keeps its args on the record): each job runs with its own.
func TestS3AttackEnqueueManyMixed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	var sn s3aSeen
	h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), true, nil)
	sizes := []int{100, 20_000, ledger.MaxInlineArgsBytes, ledger.MaxInlineArgsBytes + 1, 300, 1 << 20, 50, 200_000}
	var items []enqueue.Item
	var want []s3aArgs
	for i, n := range sizes {
		a := s3aArgsOfSize(string(rune('A'+i)), n)
		want = append(want, a)
		items = append(items, enqueue.Item{Args: a})
	}
	deb := s3aArgsOfSize("deb", 100_000)
	items = append(items, enqueue.Item{Args: deb, Opts: &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "s3a-deb", Period: time.Second}}})
	out, err := r.e.Client.EnqueueMany(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range sizes {
		rec := r.e.Get(t, out[i].ID)
		if (n > ledger.MaxInlineArgsBytes) != (rec.ArgsBlob != "") {
			t.Fatalf("item %d (%d bytes of args): the record keeps %d bytes, names %q", i, n, len(rec.Args), rec.ArgsBlob)
		}
	}
	if rec := r.e.Get(t, out[len(sizes)].ID); rec.ArgsBlob != "" || len(rec.Args) != 100_000 {
		t.Fatalf("the debounced item: the record keeps %d bytes, names %q; want them on the record", len(rec.Args), rec.ArgsBlob)
	}
	r.e.Drain(t, h)
	for _, a := range append(want, deb) {
		if got := sn.of(a.Tag); len(got) != 1 || got[0] != len(a.Text) {
			t.Fatalf("item %s ran with %v bytes of text, want once with %d", a.Tag, got, len(a.Text))
		}
	}
}

// Debounced enqueues with large args keep them on the record (folds
// rewrite the record's args): a fold of larger args, then the job runs
// with the last.
func TestS3AttackDebouncedLargeArgs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	var sn s3aSeen
	h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), true, nil)
	d := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "s3a-d", Period: 5 * time.Second}}
	first, err := r.e.Client.Enqueue(ctx, s3aArgsOfSize("d", 40_000), d)
	if err != nil {
		t.Fatal(err)
	}
	last := s3aArgsOfSize("d", 300_000)
	fold, err := r.e.Client.Enqueue(ctx, last, d)
	if err != nil || fold.ID != first.ID {
		t.Fatalf("the fold: %+v, %v", fold, err)
	}
	if rec := r.e.Get(t, first.ID); rec.ArgsBlob != "" || len(rec.Args) != 300_000 {
		t.Fatalf("a debounced job's large args: the record keeps %d bytes, names %q; want them on the record", len(rec.Args), rec.ArgsBlob)
	}
	r.e.Drain(t, h)
	if got := sn.of("d"); len(got) != 1 || got[0] != len(last.Text) {
		t.Fatalf("the debounced job ran with %v bytes, want once with the last args' %d", got, len(last.Text))
	}
}

// A continuation keeps its args on its record ("a continuation ...
// keeps them on its record, up to 350 KB"), whether its parent is still
// running or already Succeeded.
// BREAK: ContinueWith on a Succeeded parent submits the child as Enqueue
// does, and Enqueue's decide moves args over 16 KB to the bucket.
func TestS3AttackContinuationKeepsArgsOnTheRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	var sn s3aSeen
	h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), true, nil)
	parent, err := r.e.Client.Enqueue(ctx, s3aArgs{Tag: "parent", Text: "p"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waiting, err := r.e.Client.ContinueWith(ctx, parent.ID, s3aArgsOfSize("w", 20_000), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, h)
	late, err := r.e.Client.ContinueWith(ctx, parent.ID, s3aArgsOfSize("late", 20_000), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, h)
	if got := sn.of("late"); len(got) != 1 {
		t.Fatalf("the late continuation ran %v", got)
	}
	for _, c := range []struct{ name, id string }{{"a continuation of a running parent", waiting.ID}, {"a continuation of a Succeeded parent", late.ID}} {
		if rec := r.e.Get(t, c.id); rec.ArgsBlob != "" || len(rec.Args) != 20_000 {
			t.Errorf("%s (20,000 bytes of args): the record keeps %d bytes and names %q; durable-jobs.md: \"a continuation ... keeps them on its record, up to 350 KB\"", c.name, len(rec.Args), rec.ArgsBlob)
		}
	}
}

// The replay export of an open job with args in the bucket holds them
// whole ("the replay export read them").
func TestS3AttackExportReadsLargeArgs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	a := s3aArgsOfSize("exp", 1<<20)
	res, err := r.e.Client.Enqueue(ctx, a, &enqueue.Opts{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ex := r.e.Export(t, "s3a-args", nil)
	if len(ex.Jobs) != 1 || ex.Jobs[0].ID != res.ID || ex.Jobs[0].Args != mustJSON(t, a) {
		n := -1
		if len(ex.Jobs) == 1 {
			n = len(ex.Jobs[0].Args)
		}
		t.Fatalf("the export of an open job with 1 MB of args in the bucket: %d jobs, %d bytes of args; want its args whole", len(ex.Jobs), n)
	}
}

// An args object a year old is written again by the run that reads it
// (so the lifecycle, two years, never takes a job's args while it is
// open); a younger one is not.
func TestS3AttackArgsRenewedAfterAYear(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	var sn s3aSeen
	h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), true, nil)
	young, err := r.e.Client.Enqueue(ctx, s3aArgsOfSize("young", 30_000), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, h)
	puts := r.sf.n("PUT", "args/")
	if r.e.Get(t, young.ID).State != ledger.Succeeded || puts != 1 {
		t.Fatalf("a young args object: %d PutObjects on args/ (want the enqueue's one)", puts)
	}
	old, err := r.e.Client.Enqueue(ctx, s3aArgsOfSize("old", 30_000), &enqueue.Opts{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r.e.Advance(t, 367*24*time.Hour)
	rec := r.e.RunToEnd(t, h, old.ID)
	if got := sn.of("old"); rec.State != ledger.Succeeded || len(got) != 1 || r.sf.n("PUT", "args/") != puts+2 {
		t.Fatalf("an args object a year old: job %s (%s), ran %v, %d PutObjects on args/ (want the enqueue's and the renewal)", rec.State, rec.LastError, got, r.sf.n("PUT", "args/")-puts)
	}
}

// A dead-letter hook's record has Args empty for a job whose args are
// in the bucket; ledger.Store.ArgsOf reads them.
func TestS3AttackDeadLetterHookReadsArgs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	type hooked struct {
		inline int
		args   string
		err    error
	}
	got := make(chan hooked, 1)
	var store *ledger.Store
	var once sync.Once
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[s3aArgs](func(context.Context, *handler.Job[s3aArgs]) error {
		return handler.Permanent(errors.New("refused"))
	}), &handler.KindOptions{OnDeadLetter: func(ctx context.Context, rec ledger.Record, _ error) error {
		once.Do(func() {
			a, err := store.ArgsOf(ctx, rec, false)
			got <- hooked{len(rec.Args), a, err}
		})
		return nil
	}})
	h := r.handlerFor(t, reg, true, nil)
	store = r.e.Client.Store()
	a := s3aArgsOfSize("dl", 40_000)
	if _, err := r.e.Client.Enqueue(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, h)
	hk := <-got
	if hk.inline != 0 || hk.err != nil || hk.args != mustJSON(t, a) {
		t.Fatalf("the dead-letter hook: %d bytes of args on its record, ArgsOf %d bytes, %v; want none, and ArgsOf the whole args", hk.inline, len(hk.args), hk.err)
	}
}
