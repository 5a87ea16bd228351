package handler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// A keyed job's large result, read by its id after a newer job took the
// key (the ended one moved aside under its id): each id reads its own
// result, never the other's.
func TestS3AttackKeyedResultsReadByID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	h := r.handlerFor(t, s3aRegistry(nil, nil, nil, nil), true, nil)
	o := &enqueue.Opts{IdempotencyKey: "s3a-res-key"}
	old, err := r.e.Client.Enqueue(ctx, s3aRes{Size: 30_000, Fill: "o", Pad: strings.Repeat("p", 20_000)}, o)
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, h)
	newer, err := r.e.Client.Enqueue(ctx, s3aRes{Size: 40_000, Fill: "n", Pad: strings.Repeat("q", 20_000)}, o)
	if err != nil || newer.Duplicate {
		t.Fatalf("a new job on the ended key: %+v, %v", newer, err)
	}
	r.e.Drain(t, h)
	for _, c := range []struct {
		id   string
		want string
	}{{old.ID, s3aResultOf(s3aRes{Size: 30_000, Fill: "o"})}, {newer.ID, s3aResultOf(s3aRes{Size: 40_000, Fill: "n"})}} {
		var v string
		if err := r.e.Client.Result(ctx, c.id, &v); err != nil || v != c.want {
			t.Fatalf("Result of keyed job %s: %d bytes (%.4q…), %v; want its own %d bytes (%.4q…)", c.id, len(v), v, err, len(c.want), c.want)
		}
	}
}

// EnqueueMany with one item's args object throttled past the SDK's
// retries: that item failed, not recorded, named by the *BatchError; the
// others recorded and run with their own args.
func TestS3AttackEnqueueManyOneObjectRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	var sn s3aSeen
	h := r.handlerFor(t, s3aRegistry(&sn, nil, nil, nil), true, nil)
	r.sf.add(&s3Rule{method: "PUT", prefix: "args/", fault: faults.Throttle, times: faults.Attempts})
	items := []enqueue.Item{{Args: s3aArgs{Tag: "small", Text: "x"}}, {Args: s3aArgsOfSize("big", 40_000)}}
	out, err := r.e.Client.EnqueueMany(ctx, items)
	var be *enqueue.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 1 || be.Failed[0] != 1 || out[1].Recorded || !out[0].Recorded || !out[0].Sent {
		t.Fatalf("EnqueueMany with the large item's object refused: %v, %+v", err, out)
	}
	r.e.Drain(t, h)
	if got, gone := sn.of("small"), sn.of("big"); len(got) != 1 || len(gone) != 0 {
		t.Fatalf("after a refused item: the small one ran %v, the refused one %v", got, gone)
	}
}

// One open job whose args object someone replaced ("anyone who may
// enqueue may write args/") and the replay export of its kind: Read
// "exports the open jobs of kind". The forged job's run is refused; the
// other open jobs of the kind are still exported.
// BREAK: ledger's OpenJobs returns ArgsOf's error for the forged job, so
// replay.Read (nexjob export) fails for the whole kind.
func TestS3AttackExportWithAForgedObject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newS3Rig(t, true)
	good, err := r.e.Client.Enqueue(ctx, s3aArgsOfSize("good", 30_000), &enqueue.Opts{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	forged, err := r.e.Client.Enqueue(ctx, s3aArgsOfSize("forged", 30_000), &enqueue.Opts{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r.put(t, r.e.Get(t, forged.ID).ArgsBlob, mustJSON(t, s3aArgsOfSize("forged", 30_001)))
	ex, err := readExport(ctx, r, "s3a-args")
	if err != nil {
		t.Fatalf("replay.Read of a kind with one forged args object (producer-writable args/): %v; want the open jobs exported (job %s at least)", err, good.ID)
	}
	found := false
	for _, j := range ex.Jobs {
		found = found || j.ID == good.ID
	}
	if !found {
		t.Fatalf("the export of %d jobs lacks the job with intact args %s", len(ex.Jobs), good.ID)
	}
	_ = ledger.ErrBlobMissing
}
