package handler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/settings"
)

// Results over the record's room in S3 (writing-jobs.md, "Bounded."):
// "At most ledger.MaxResultBytes (16 KB) of JSON on the record ... With a
// blob bucket ... a larger one, up to ledger.MaxBlobStepBytes (32 MB), is
// written first as an S3 object (results/<job id>/<its SHA-256>) that the
// record names (Record.ResultBlob); Client.Result, Wait, an awaiting
// caller and nexjob get read it back with one GetObject".

// s3aDeliver hands job id's message to h as one SQS delivery of its own.
func s3aDeliver(ctx context.Context, h *handler.Handler, id, kind, msgID string) events.SQSEventResponse {
	body := fmt.Sprintf(`{"v":1,"id":%q,"kind":%q}`, id, kind)
	resp, _ := h.Handle(ctx, events.SQSEvent{Records: []events.SQSMessage{{MessageId: msgID, ReceiptHandle: "rh-" + msgID, Body: body}}})
	return resp
}

// The room's edges: 16 KB on the record, 16 KB + 1 in the bucket,
// 32 MB in the bucket and read back whole, 32 MB + 1 refused for good.
func TestS3AttackResultSizes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		size int
		blob bool
		fail bool
	}{
		{"16KB on the record", ledger.MaxResultBytes, false, false},
		{"16KB+1 in the bucket", ledger.MaxResultBytes + 1, true, false},
		{"32MB in the bucket", ledger.MaxBlobStepBytes, true, false},
		{"32MB+1 refused", ledger.MaxBlobStepBytes + 1, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newS3Rig(t, true)
			h := r.handlerFor(t, s3aRegistry(nil, nil, nil, nil), true, nil)
			res, err := r.e.Client.Enqueue(ctx, s3aRes{Size: tc.size}, nil)
			if err != nil {
				t.Fatal(err)
			}
			r.e.Drain(t, h)
			rec := r.e.Get(t, res.ID)
			if tc.fail {
				var v string
				var nse *enqueue.NotSucceededError
				if rec.State != ledger.Failed || rec.Attempt != 1 || !strings.Contains(rec.LastError, "result") || !errors.As(r.e.Client.Result(ctx, res.ID, &v), &nse) {
					t.Fatalf("a result of %d bytes (over MaxBlobStepBytes): %s at attempt %d (%s); want Failed for good, its result too large", tc.size, rec.State, rec.Attempt, rec.LastError)
				}
				return
			}
			if rec.State != ledger.Succeeded {
				t.Fatalf("a result of %d bytes: job %s (%s)", tc.size, rec.State, rec.LastError)
			}
			if tc.blob != (rec.ResultBlob != "") || tc.blob != (rec.Result == "") {
				t.Fatalf("a result of %d bytes: the record keeps %d bytes and names %q; want it in the bucket: %v", tc.size, len(rec.Result), rec.ResultBlob, tc.blob)
			}
			var v string
			if err := r.e.Client.Result(ctx, res.ID, &v); err != nil || len(v) != tc.size-2 {
				t.Fatalf("Result of a %d-byte result: %d bytes, %v", tc.size, len(v), err)
			}
			end, err := r.e.Client.Wait(ctx, res.ID, nil)
			if err != nil || len(end.Result) != tc.size {
				t.Fatalf("Wait of a %d-byte result: %d bytes, %v", tc.size, len(end.Result), err)
			}
		})
	}
}

// Faults around the result's object and the record's write: a lost reply
// to the object's PutObject and to the finish naming it, a throttle of
// the PutObject past the SDK's retries, a lost reply and a throttle of
// the reader's GetObject. The job ends Succeeded once, the record names
// an object that holds its result, the reader gets it or an error, never
// a silent empty result.
func TestS3AttackResultUnderFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	size := 100_000
	t.Run("lost replies to the object and the finish", func(t *testing.T) {
		t.Parallel()
		r := newS3Rig(t, true)
		h := r.handlerFor(t, s3aRegistry(nil, nil, nil, nil), true, nil)
		put := r.sf.add(&s3Rule{method: "PUT", prefix: "results/", fault: faults.LostReply})
		fin := r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Match: func(b []byte) bool { return strings.Contains(string(b), "resultBlob") }, Fault: faults.LostReply})
		res, err := r.e.Client.Enqueue(ctx, s3aRes{Size: size}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.e.Drain(t, h)
		rec := r.e.Get(t, res.ID)
		if r.sf.fired(put) != 1 || fin.Fired() != 1 {
			t.Fatalf("the faults fired %d and %d times, want 1 each", r.sf.fired(put), fin.Fired())
		}
		var v string
		if rec.State != ledger.Succeeded || rec.Attempt != 1 || rec.ResultBlob == "" {
			t.Fatalf("after lost replies: %s at attempt %d (%s), names %q; want Succeeded once, naming its object", rec.State, rec.Attempt, rec.LastError, rec.ResultBlob)
		}
		if err := r.e.Client.Result(ctx, res.ID, &v); err != nil || v != s3aResultOf(s3aRes{Size: size}) {
			t.Fatalf("Result after lost replies: %d bytes, %v", len(v), err)
		}
		if objs := r.objects(t, "results/"+res.ID+"/"); len(objs) != 1 || objs[0] != rec.ResultBlob {
			t.Fatalf("objects under results/%s/: %v; want the one the record names (%s)", res.ID, objs, rec.ResultBlob)
		}
	})
	t.Run("the object's write throttled past the SDK's retries", func(t *testing.T) {
		t.Parallel()
		r := newS3Rig(t, true)
		h := r.handlerFor(t, s3aRegistry(nil, nil, nil, nil), true, nil)
		put := r.sf.add(&s3Rule{method: "PUT", prefix: "results/", fault: faults.Throttle, times: faults.Attempts})
		res, err := r.e.Client.Enqueue(ctx, s3aRes{Size: size}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.e.Drain(t, h)
		if st := r.e.Get(t, res.ID).State; st == ledger.Processing {
			// The message came back with the run's lease: past it, the run is
			// an orphan's, run again.
			r.e.Advance(t, time.Hour)
			r.e.Drain(t, h)
		}
		rec := r.e.Get(t, res.ID)
		var v string
		if r.sf.fired(put) != faults.Attempts || rec.State != ledger.Succeeded || rec.ResultBlob == "" {
			t.Fatalf("after a throttled PutObject (fired %d): %s (%s), names %q; want Succeeded naming its object", r.sf.fired(put), rec.State, rec.LastError, rec.ResultBlob)
		}
		if err := r.e.Client.Result(ctx, res.ID, &v); err != nil || len(v) != size-2 {
			t.Fatalf("Result: %d bytes, %v", len(v), err)
		}
	})
	t.Run("the reader's GetObject lost and throttled", func(t *testing.T) {
		t.Parallel()
		r := newS3Rig(t, true)
		h := r.handlerFor(t, s3aRegistry(nil, nil, nil, nil), true, nil)
		res, err := r.e.Client.Enqueue(ctx, s3aRes{Size: size}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.e.Drain(t, h)
		r.sf.add(&s3Rule{method: "GET", prefix: "results/", fault: faults.LostReply})
		var v string
		if err := r.e.Client.Result(ctx, res.ID, &v); err != nil || len(v) != size-2 {
			t.Fatalf("Result with a lost GetObject reply: %d bytes, %v", len(v), err)
		}
		r.sf.add(&s3Rule{method: "GET", prefix: "results/", fault: faults.Throttle, times: faults.Attempts})
		v = ""
		err = r.e.Client.Result(ctx, res.ID, &v)
		if err == nil || errors.Is(err, enqueue.ErrNoResult) || v != "" {
			t.Fatalf("Result with its GetObject throttled past the SDK's retries: %v (%d bytes); want an AWS error, wrapped", err, len(v))
		}
		r.sf.add(&s3Rule{method: "GET", prefix: "results/", fault: faults.Throttle, times: faults.Attempts})
		end, err := r.e.Client.Wait(ctx, res.ID, nil)
		if err == nil || len(end.Result) != 0 {
			t.Fatalf("Wait with its GetObject throttled past the SDK's retries: %v (%d bytes, state %s); want an AWS error ending the wait", err, len(end.Result), end.State)
		}
	})
}

// A worker killed after its result's object was written and before the
// record named it: the record names no object, the job is run again
// past its lease, and its result then is whole. A second worker that
// took the job over while the first went on: the first's finish is
// fenced, the record names the second's result, never the first's.
func TestS3AttackResultKilledAndFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	size := 50_000
	t.Run("killed between the object and the record", func(t *testing.T) {
		t.Parallel()
		r := newS3Rig(t, true)
		var mu sync.Mutex
		runs := 0
		h := r.handlerFor(t, s3aRegistry(nil, func(j *handler.Job[s3aRes]) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			runs++
			return s3aResultOf(s3aRes{Size: size, Fill: string(rune('a' + runs - 1))}), nil
		}, nil, nil), true, nil)
		res, err := r.e.Client.Enqueue(ctx, s3aRes{Size: size}, nil)
		if err != nil {
			t.Fatal(err)
		}
		kctx, kill := context.WithCancel(ctx)
		killAt := r.sf.add(&s3Rule{method: "PUT", prefix: "results/", fault: faults.Pass, after: kill})
		s3aDeliver(kctx, h, res.ID, "s3a-res", "killed")
		rec := r.e.Get(t, res.ID)
		if r.sf.fired(killAt) != 1 || len(r.objects(t, "results/"+res.ID+"/")) != 1 {
			t.Fatalf("the kill came at %d PutObjects, %d objects written", r.sf.fired(killAt), len(r.objects(t, "results/"+res.ID+"/")))
		}
		t.Logf("after the kill: %s, names %q", rec.State, rec.ResultBlob)
		if rec.State.Terminal() && rec.ResultBlob == "" {
			t.Fatalf("the killed run ended the job %s with no object named", rec.State)
		}
		if rec.State == ledger.Succeeded {
			t.Logf("the killed run's finish landed before its context ended")
		}
		r.e.Advance(t, time.Hour)
		r.e.Drain(t, h)
		rec = r.e.Get(t, res.ID)
		var v string
		if rec.State != ledger.Succeeded {
			t.Fatalf("after the kill: %s (%s)", rec.State, rec.LastError)
		}
		if err := r.e.Client.Result(ctx, res.ID, &v); err != nil || len(v) != size-2 {
			t.Fatalf("Result after the kill: %d bytes, %v", len(v), err)
		}
		objs := r.objects(t, "results/"+res.ID+"/")
		found := false
		for _, k := range objs {
			found = found || k == rec.ResultBlob
		}
		if !found {
			t.Fatalf("the record names %s, the bucket holds %v", rec.ResultBlob, objs)
		}
	})
	t.Run("fenced by a newer run", func(t *testing.T) {
		t.Parallel()
		r := newS3Rig(t, true)
		started, release := make(chan struct{}), make(chan struct{})
		var mu sync.Mutex
		runs := 0
		h := r.handlerFor(t, s3aRegistry(nil, func(j *handler.Job[s3aRes]) (string, error) {
			mu.Lock()
			runs++
			n := runs
			mu.Unlock()
			if n == 1 {
				close(started)
				<-release
				return s3aResultOf(s3aRes{Size: size, Fill: "o"}), nil // the old run's
			}
			return s3aResultOf(s3aRes{Size: size, Fill: "n"}), nil // the newer run's
		}, nil, nil), true, nil)
		res, err := r.e.Client.Enqueue(ctx, s3aRes{Size: size}, nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			s3aDeliver(ctx, h, res.ID, "s3a-res", "old")
		}()
		<-started
		r.e.Advance(t, time.Hour) // past the old run's lease
		s3aDeliver(ctx, h, res.ID, "s3a-res", "new")
		close(release)
		<-done
		rec := r.e.Get(t, res.ID)
		var v string
		if err := r.e.Client.Result(ctx, res.ID, &v); rec.State != ledger.Succeeded || err != nil || v != s3aResultOf(s3aRes{Size: size, Fill: "n"}) {
			t.Fatalf("after a fenced run: %s, Result %q… (%d bytes), %v; want the newer run's result", rec.State, v[:min(len(v), 8)], len(v), err)
		}
		if objs := r.objects(t, "results/"+res.ID+"/"); len(objs) != 2 {
			t.Fatalf("the fenced run wrote no object of its own: %v", objs)
		}
		// A duplicate delivery of the ended job changes nothing.
		s3aDeliver(ctx, h, res.ID, "s3a-res", "dup")
		if again := r.e.Get(t, res.ID); again.ResultBlob != rec.ResultBlob || again.Token != rec.Token {
			t.Fatalf("a duplicate delivery of the Succeeded job moved it: names %s (was %s), token %d (was %d)", again.ResultBlob, rec.ResultBlob, again.Token, rec.Token)
		}
	})
}

// A requeue of a job with large args and a large result: the new run's
// result replaces the old; while the job is open again, nobody reads the
// old one as its result; a run that ends without one keeps none.
func TestS3AttackRequeueReplacesTheResult(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	var mu sync.Mutex
	next := ""
	h := r.handlerFor(t, s3aRegistry(nil, func(j *handler.Job[s3aRes]) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		switch next {
		case "fail":
			return "", handler.Permanent(errors.New("this run fails"))
		case "":
			return s3aResultOf(j.Args), nil
		}
		return next, nil
	}, nil, nil), true, nil)
	set := func(s string) { mu.Lock(); next = s; mu.Unlock() }
	a, err := admin.New(settings.Settings{AWS: r.e.Cfg, Table: r.e.Table, QueueURL: r.e.QueueURL, StepsTable: r.e.StepsTable, BlobBucket: r.e.BlobBucket, Retention: handler.DefaultRetention})
	if err != nil {
		t.Fatal(err)
	}
	args := s3aRes{Size: 60_000, Fill: "a", Pad: strings.Repeat("p", 40_000)}
	res, err := r.e.Client.Enqueue(ctx, args, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, h)
	first := r.e.Get(t, res.ID)
	if first.State != ledger.Succeeded || first.ResultBlob == "" || first.ArgsBlob == "" {
		t.Fatalf("the first run: %s, result object %q, args object %q", first.State, first.ResultBlob, first.ArgsBlob)
	}
	check := func(step, want string) {
		t.Helper()
		var v string
		err := r.e.Client.Result(ctx, res.ID, &v)
		if err != nil || v != want {
			t.Fatalf("%s: Result %d bytes (%.8q…), %v; want %d bytes (%.8q…)", step, len(v), v, err, len(want), want)
		}
		end, err := r.e.Client.Wait(ctx, res.ID, nil)
		var w string
		if err != nil || end.Decode(&w) != nil || w != want {
			t.Fatalf("%s: Wait %d bytes, %v", step, len(w), err)
		}
		shown, _, err := a.Timeline(ctx, res.ID)
		if err != nil || shown.SucceededResult() != `"`+want+`"` {
			t.Fatalf("%s: the timeline shows %d bytes of result, %v", step, len(shown.SucceededResult()), err)
		}
	}
	check("the first run", s3aResultOf(args))
	requeue := func(step string) {
		t.Helper()
		if _, err := r.e.Client.Requeue(ctx, res.ID); err != nil {
			t.Fatal(err)
		}
		var v string
		var ne *enqueue.NotEndedError
		if err := r.e.Client.Result(ctx, res.ID, &v); !errors.As(err, &ne) || v != "" {
			t.Fatalf("%s: Result of the requeued job before its run: %v, %d bytes; want a *NotEndedError, no stale result", step, err, len(v))
		}
		if shown, _, err := a.Timeline(ctx, res.ID); err != nil || shown.SucceededResult() != "" {
			t.Fatalf("%s: the timeline of the requeued job shows %d bytes of result, %v", step, len(shown.SucceededResult()), err)
		}
	}
	// Another large result.
	requeue("a second large result")
	other := strings.Repeat("b", 70_000)
	set(other)
	r.e.Drain(t, h)
	check("a second large result", other)
	// A small one: on the record, the object no longer named.
	requeue("a small result")
	set("small")
	r.e.Drain(t, h)
	if rec := r.e.Get(t, res.ID); rec.ResultBlob != "" || rec.Result != `"small"` {
		t.Fatalf("a small result after a large one: the record keeps %q and names %q", rec.Result, rec.ResultBlob)
	}
	check("a small result", "small")
	// Large again, then a failure: no result at all.
	requeue("large again")
	set("")
	r.e.Drain(t, h)
	check("large again", s3aResultOf(args))
	requeue("a failure")
	set("fail")
	r.e.Drain(t, h)
	var v string
	var nse *enqueue.NotSucceededError
	if err := r.e.Client.Result(ctx, res.ID, &v); !errors.As(err, &nse) || v != "" {
		t.Fatalf("a failed run after a large result: Result %v, %d bytes; want a *NotSucceededError", err, len(v))
	}
	if rec := r.e.Get(t, res.ID); rec.ResultBlob != "" || rec.Result != "" {
		t.Fatalf("a failed run after a large result: the record keeps %d bytes and names %q", len(rec.Result), rec.ResultBlob)
	}
}

// The result's object deleted (by hand, or a lifecycle shorter than the
// record's retention), or read by a process with no blob bucket:
// ResultOf's "ErrBlobMissing when gone, or when this store has no blob
// bucket" through Client.Result and Wait, never a silent empty result.
func TestS3AttackResultObjectGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	h := r.handlerFor(t, s3aRegistry(nil, nil, nil, nil), true, nil)
	kept, err := r.e.Client.Enqueue(ctx, s3aRes{Size: 40_000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := r.e.Client.Enqueue(ctx, s3aRes{Size: 40_000, Fill: "g"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, h)
	r.del(t, r.e.Get(t, gone.ID).ResultBlob)
	var v string
	if err := r.e.Client.Result(ctx, gone.ID, &v); !errors.Is(err, ledger.ErrBlobMissing) || v != "" {
		t.Fatalf("Result of a job whose result object is gone: %v, %d bytes; want ErrBlobMissing", err, len(v))
	}
	if end, err := r.e.Client.Wait(ctx, gone.ID, nil); !errors.Is(err, ledger.ErrBlobMissing) || len(end.Result) != 0 {
		t.Fatalf("Wait of a job whose result object is gone: %v, %d bytes; want ErrBlobMissing", err, len(end.Result))
	}
	plain, err := r.client(false)
	if err != nil {
		t.Fatal(err)
	}
	v = ""
	if err := plain.Result(ctx, kept.ID, &v); !errors.Is(err, ledger.ErrBlobMissing) || v != "" {
		t.Fatalf("Result read by a process with no blob bucket: %v, %d bytes; want ErrBlobMissing", err, len(v))
	}
	if end, err := plain.Wait(ctx, kept.ID, nil); !errors.Is(err, ledger.ErrBlobMissing) {
		t.Fatalf("Wait by a process with no blob bucket: %v, %d bytes; want ErrBlobMissing", err, len(end.Result))
	}
}

// A caller awaiting a child started with large args whose result is
// large: the child's args are an object, the caller gets the child's
// result whole, also when its first read of the child's result object
// is throttled past the SDK's retries (its run fails and is retried).
func TestS3AttackChildLargeArgsLargeResult(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	var got sync.Map
	h := r.handlerFor(t, s3aRegistry(nil, nil, &got, nil), true, nil)
	thr := r.sf.add(&s3Rule{method: "GET", prefix: "results/", fault: faults.Throttle, times: faults.Attempts})
	size := 200_000
	caller, err := r.e.Client.Enqueue(ctx, s3aCaller{Size: size, Pad: 30_000, Fill: "c"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := r.e.RunToEnd(t, h, caller.ID)
	if rec.State != ledger.Succeeded {
		t.Fatalf("the caller: %s (%s)", rec.State, rec.LastError)
	}
	v, _ := got.Load(caller.ID)
	if s, _ := v.(string); s != s3aResultOf(s3aRes{Size: size, Fill: "c"}) || r.sf.fired(thr) != faults.Attempts {
		t.Fatalf("the caller got %d bytes of its child's %d-byte result (the throttle fired %d)", len(s), size-2, r.sf.fired(thr))
	}
	var child ledger.Record
	for _, j := range r.e.Scan(t) {
		if j.Kind == "s3a-res" {
			child = j
		}
	}
	if child.ArgsBlob == "" || child.ResultBlob == "" || child.State != ledger.Succeeded {
		t.Fatalf("the child: %s, args object %q, result object %q; want both in the bucket", child.State, child.ArgsBlob, child.ResultBlob)
	}
}
