package handler_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

type step struct {
	Name string
	Fail bool
}

func (step) Kind() string { return "flow-step" }

// flowRig is an Env with a worker for step jobs that records the order
// in which they ran.
type flowRig struct {
	e   *awstest.Env
	h   *handler.Handler
	mu  sync.Mutex
	ran []string
}

func newFlowRig(t *testing.T) *flowRig {
	r := &flowRig{e: awstest.New(t, nil)}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[step](func(_ context.Context, j *handler.Job[step]) error {
		r.mu.Lock()
		r.ran = append(r.ran, j.Args.Name)
		r.mu.Unlock()
		if j.Args.Fail {
			return handler.Permanent(errors.New("step failed"))
		}
		return nil
	}), nil)
	r.h = r.e.Handler(t, reg, nil)
	return r
}

// theFlow: a, then b and c, then d once both b and c Succeeded (a
// fan-in), then e after d.
func theFlow(key string, failA bool) enqueue.Flow {
	return enqueue.Flow{
		Args: step{Name: "a", Fail: failA}, Opts: &enqueue.Opts{IdempotencyKey: key},
		Then: []enqueue.Flow{{Args: step{Name: "b"}}, {Args: step{Name: "c"}}},
		Join: &enqueue.Flow{Args: step{Name: "d"}, Then: []enqueue.Flow{{Args: step{Name: "e"}}}},
	}
}

// TestFlowInOneCall (issue 30, item 6): a job and its continuations,
// fan-in included, are written in one call; the continuations run after
// their parents, and with a parent that fails at once they end as it did:
// no producer meets "parent job … is Failed; a continuation of it would
// never run", as two ContinueWith calls after a fast worker's failure did.
// A repeat of the flow's key writes nothing and returns its first job.
func TestFlowInOneCall(t *testing.T) {
	t.Parallel()
	r := newFlowRig(t)
	ctx := context.Background()
	res, err := r.e.Client.EnqueueFlow(ctx, theFlow("order-1", false))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Then) != 2 || res.Join == nil || len(res.Join.Then) != 1 || res.Then[0].State != ledger.AwaitingContinuation {
		t.Fatalf("flow result %+v; want 2 Then waiting, a Join with 1 Then", res)
	}
	again, err := r.e.Client.EnqueueFlow(ctx, theFlow("order-1", false))
	if err != nil || !again.Duplicate || again.ID != res.ID {
		t.Fatalf("the flow again: %+v, %v; want its first job as a duplicate", again, err)
	}
	if n := len(r.e.Records(t)); n != 5 {
		t.Fatalf("%d records; want the 5 jobs of one flow", n)
	}
	r.e.Drain(t, r.h)
	for _, id := range []string{res.ID, res.Then[0].ID, res.Then[1].ID, res.Join.ID, res.Join.Then[0].ID} {
		r.e.RequireState(t, id, ledger.Succeeded)
	}
	pos := func(n string) int { return slices.Index(r.ran, n) }
	if len(r.ran) != 5 || pos("a") != 0 || pos("d") < pos("b") || pos("d") < pos("c") || pos("e") != 4 {
		t.Fatalf("ran %v; want a first, d after b and c, e last", r.ran)
	}

	// A first job that fails at once: every continuation ends as it did.
	failed, err := r.e.Client.EnqueueFlow(ctx, theFlow("order-2", true))
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, r.h)
	r.e.RequireState(t, failed.ID, ledger.Failed)
	for _, id := range []string{failed.Then[0].ID, failed.Then[1].ID, failed.Join.ID, failed.Join.Then[0].ID} {
		if rec := r.e.RequireState(t, id, ledger.Failed); rec.Attempt != 0 {
			t.Fatalf("continuation %s ran (attempt %d) under a failed parent", id, rec.Attempt)
		}
	}
}

// TestFlowUnderFaults: the flow's one transaction applied with its reply
// lost reads as done (one flow, not a duplicate of itself), and one
// throttled past the SDK's retries writes nothing at all and says so.
func TestFlowUnderFaults(t *testing.T) {
	t.Parallel()
	for _, fault := range []faults.Fault{faults.LostReply, faults.Throttle} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			ft, cfg := e.Faulty()
			c, err := enqueue.New(cfg, e.Table, e.QueueURL, nil)
			if err != nil {
				t.Fatal(err)
			}
			rule := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: fault, Times: faults.Attempts})
			res, err := c.EnqueueFlow(context.Background(), theFlow("order-3", false))
			if rule.Fired() == 0 {
				t.Fatal("the fault never fired")
			}
			recs := e.Records(t)
			switch fault {
			case faults.LostReply:
				if err != nil || res.Duplicate || len(recs) != 5 || e.Get(t, res.ID).State != ledger.Enqueued {
					t.Fatalf("lost reply: %+v, %v, %d records; want the flow, created, 5 records", res, err, len(recs))
				}
			case faults.Throttle:
				if !errors.Is(err, enqueue.ErrTxNotCommitted) || len(recs) != 0 {
					t.Fatalf("throttled: %v, %d records; want ErrTxNotCommitted and nothing written", err, len(recs))
				}
			}
		})
	}
}

// TestFlowBadInput: a continuation with a key of its own, a Join over one
// job, and a continuation with a Delay are refused with an *InputError,
// nothing written.
func TestFlowBadInput(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	for name, f := range map[string]enqueue.Flow{
		"a continuation's key": {Args: step{Name: "a"}, Then: []enqueue.Flow{{Args: step{Name: "b"}, Opts: &enqueue.Opts{IdempotencyKey: "k"}}}},
		"a Join over one":      {Args: step{Name: "a"}, Then: []enqueue.Flow{{Args: step{Name: "b"}}}, Join: &enqueue.Flow{Args: step{Name: "c"}}},
		"a Delay":              {Args: step{Name: "a"}, Then: []enqueue.Flow{{Args: step{Name: "b"}, Opts: &enqueue.Opts{Delay: 1}}}},
	} {
		_, err := e.Client.EnqueueFlow(context.Background(), f)
		var in *enqueue.InputError
		if !errors.As(err, &in) {
			t.Errorf("%s: %v; want an *InputError", name, err)
		}
	}
	if n := len(e.Records(t)); n != 0 {
		t.Fatalf("%d records written by refused flows", n)
	}
}

// TestFlowCosts: a keyed flow of 5 jobs (a, then b and c, then d after
// both, then e) is one consistent read of the first job's key, one
// TransactWriteItems of the 5 jobs (10 write units; the 4 waiting ones
// in the index) and the first job's send (docs/writing-jobs.md).
func TestFlowCosts(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	meter := e.Meter(&cfg)
	c, err := enqueue.New(cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	step := meterStep(t, meter)
	step("a flow of 5 jobs", []string{"DynamoDB.GetItem", "DynamoDB.TransactWriteItems", "SQS.SendMessage"}, awstest.Units{Write: 10, Index: 4, Read: 1, Sends: 1}, func() {
		if _, err := c.EnqueueFlow(context.Background(), theFlow("flow-cost", false)); err != nil {
			t.Fatal(err)
		}
	})
}
