package enqueue_test

// Attacks on EnqueueFlow's documented promises (go doc ./enqueue
// EnqueueFlow, Flow, FlowResult, MaxFlowJobs). Each test asserts a
// sentence of the doc; a failing one is a break.

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

type atkStep struct {
	Name string `json:"name"`
	Fail bool   `json:"fail,omitempty"`
	Pad  string `json:"pad,omitempty"`
}

func (atkStep) Kind() string { return "atk-step" }

// atkByArgs is a kind keyed by its args (Defaults.KeyByArgs).
type atkByArgs struct{ Name string }

func (atkByArgs) Kind() string                  { return "atk-byargs" }
func (atkByArgs) JobDefaults() enqueue.Defaults { return enqueue.Defaults{KeyByArgs: true} }

// atkFlow: a, then b and c, then d once both Succeeded, then e after d.
func atkFlow(key string, failA bool) enqueue.Flow {
	var o *enqueue.Opts
	if key != "" {
		o = &enqueue.Opts{IdempotencyKey: key}
	}
	return enqueue.Flow{
		Args: atkStep{Name: "a", Fail: failA}, Opts: o,
		Then: []enqueue.Flow{{Args: atkStep{Name: "b"}}, {Args: atkStep{Name: "c"}}},
		Join: &enqueue.Flow{Args: atkStep{Name: "d"}, Then: []enqueue.Flow{{Args: atkStep{Name: "e"}}}},
	}
}

// flowIDs lists the ids of a FlowResult, depth first.
func flowIDs(r enqueue.FlowResult) []string {
	ids := []string{r.ID}
	for _, t := range r.Then {
		ids = append(ids, flowIDs(t)...)
	}
	if r.Join != nil {
		ids = append(ids, flowIDs(*r.Join)...)
	}
	return ids
}

// atkRig: an Env with a worker for atkStep that records the order of runs.
type atkRig struct {
	e   *awstest.Env
	h   *handler.Handler
	mu  sync.Mutex
	ran []string
}

func newAtkRig(t *testing.T) *atkRig {
	r := &atkRig{e: awstest.New(t, nil)}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[atkStep](func(_ context.Context, j *handler.Job[atkStep]) error {
		r.mu.Lock()
		r.ran = append(r.ran, j.Args.Name)
		r.mu.Unlock()
		if j.Args.Fail {
			return handler.Permanent(errors.New("step failed"))
		}
		return nil
	}), nil)
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quietLog})
	return r
}

// TestAttackFlowLostReplySingleJob: a flow of one job (no Then), its
// transaction applied and its reply lost. Doc: "A commit of unknown
// outcome is read back (found: committed)" and EnqueueFlow "writes a job
// ... then sends the first job". The SDK's resend fails on the first
// job's own items alone, which keyMoved reads as the key changing hands:
// the flow is prepared again, and so a keyed job is met as a duplicate
// of itself (not sent), an unkeyed one written a second time.
func TestAttackFlowLostReplySingleJob(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"single-1", ""} {
		t.Run("key="+key, func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			c, ft := faultyClient(t, e)
			h := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.LostReply})
			f := enqueue.Flow{Args: atkStep{Name: "solo"}}
			if key != "" {
				f.Opts = &enqueue.Opts{IdempotencyKey: key}
			}
			res, err := c.EnqueueFlow(context.Background(), f)
			if h.Fired() != 1 {
				t.Fatalf("the lost reply fired %d times", h.Fired())
			}
			if err != nil {
				t.Fatalf("lost reply: %v", err)
			}
			if res.Duplicate {
				t.Errorf("lost reply: the flow's own new job %s reported as a duplicate (found: committed, want created)", res.ID)
			}
			if n := jobs(t, e); n != 1 {
				t.Errorf("lost reply: %d job records, want the 1 job of the flow", n)
			}
			checkMessages(t, e, 1)
		})
	}
}

// TestAttackFlowLostReplyWhole: with continuations, an unkeyed or keyed
// flow, or a keyed one replacing an ended holder, applied with its reply
// lost (or timed out) is the flow, created, once, sent once.
func TestAttackFlowLostReplyWhole(t *testing.T) {
	t.Parallel()
	for _, fault := range []faults.Fault{faults.LostReply, faults.Timeout} {
		for _, sit := range []string{"unkeyed", "keyed", "ended-holder"} {
			t.Run(fault.String()+"/"+sit, func(t *testing.T) {
				t.Parallel()
				e := awstest.New(t, nil)
				c, ft := faultyClient(t, e)
				ctx := context.Background()
				key := ""
				want := 5
				if sit != "unkeyed" {
					key = "whole-" + sit
				}
				if sit == "ended-holder" {
					stage(t, c, key, ledger.Failed, time.Now().Add(time.Hour))
					want = 6
					e.Purge(t, e.QueueURL)
				}
				h := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: fault})
				res, err := c.EnqueueFlow(ctx, atkFlow(key, false))
				if err != nil || res.Duplicate || h.Fired() != 1 {
					t.Fatalf("%s: %+v, %v (fired %d); want the flow created", fault, res, err, h.Fired())
				}
				if n := jobs(t, e); n != want {
					t.Fatalf("%d job records, want %d", n, want)
				}
				for _, id := range flowIDs(res) {
					e.Get(t, id)
				}
				checkMessages(t, e, 1)
			})
		}
	}
}

// TestAttackFlowRepeatUnderRateLimit: "while its job is active, a repeat
// returns it as a duplicate and writes nothing". A continuation with a
// RateLimit of 1 an hour: the repeat of the flow must still be the
// duplicate (it writes nothing, so it takes no slot, as RateLimit's doc
// says of a keyed duplicate); instead every continuation's admit takes
// a new slot before the first job's key is read.
func TestAttackFlowRepeatUnderRateLimit(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	f := enqueue.Flow{
		Args: atkStep{Name: "a"}, Opts: &enqueue.Opts{IdempotencyKey: "rl-flow"},
		Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: &enqueue.Opts{RateLimit: &enqueue.RateLimit{Key: "b-limit", Limit: 1, Period: time.Hour}}}},
	}
	first, err := c.EnqueueFlow(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.EnqueueFlow(ctx, f)
	if err != nil || !again.Duplicate || again.ID != first.ID {
		t.Fatalf("the repeat of an active flow: %+v, %v; want its first job %s as a duplicate", again, err, first.ID)
	}
	if n := jobs(t, e); n != 2 {
		t.Fatalf("%d jobs, want 2", n)
	}
}

// TestAttackFlowReplaceEnded: "the first job takes every Opts but
// Debounce". ReplaceEnded: "the ended job's record is overwritten by the
// new one in the same conditional write ... The ended job can no longer
// be read by its id." A flow's first job with ReplaceEnded over an ended
// holder must overwrite it, as Enqueue does.
func TestAttackFlowReplaceEnded(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	// As Enqueue does it (the reference).
	ref := stage(t, c, "replace-enq", ledger.Failed, time.Now().Add(time.Hour))
	if _, err := c.Enqueue(ctx, payment{OrderID: "x"}, &enqueue.Opts{IdempotencyKey: "replace-enq", ReplaceEnded: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Store().Get(ctx, ref.ID); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("Enqueue with ReplaceEnded: the ended job %s reads as %v, want not found", ref.ID, err)
	}
	old := stage(t, c, "replace-flow", ledger.Failed, time.Now().Add(time.Hour))
	res, err := c.EnqueueFlow(ctx, enqueue.Flow{
		Args: atkStep{Name: "a"}, Opts: &enqueue.Opts{IdempotencyKey: "replace-flow", ReplaceEnded: true},
		Then: []enqueue.Flow{{Args: atkStep{Name: "b"}}},
	})
	if err != nil || res.Duplicate {
		t.Fatalf("%+v, %v", res, err)
	}
	if rec, err := c.Store().Get(ctx, old.ID); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("EnqueueFlow with ReplaceEnded: the ended job %s still reads by its id (%s, %v); want it overwritten, as Opts.ReplaceEnded promises", old.ID, rec.State, err)
	}
}

// TestAttackFlowBadInput: "Bad input is an *InputError and nothing is
// written": each refused flow leaves the table empty (no job, no rate
// slot) and the queue empty.
func TestAttackFlowBadInput(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	rl := &enqueue.Opts{RateLimit: &enqueue.RateLimit{Key: "bad", Limit: 5, Period: time.Hour}}
	chain := func(n int) enqueue.Flow { // a chain of n jobs, each the Then of the one before
		f := enqueue.Flow{Args: atkStep{Name: "last"}}
		for i := 1; i < n; i++ {
			f = enqueue.Flow{Args: atkStep{Name: "x"}, Opts: rl, Then: []enqueue.Flow{f}}
		}
		return f
	}
	wide := func(n int) []enqueue.Flow {
		var fs []enqueue.Flow
		for range n {
			fs = append(fs, enqueue.Flow{Args: atkStep{Name: "w"}, Opts: rl})
		}
		return fs
	}
	huge := strings.Repeat("x", ledger.MaxArgsBytes)
	cases := map[string]enqueue.Flow{
		"MaxFlowJobs+1 in a chain":                  chain(enqueue.MaxFlowJobs + 1),
		"MaxFlowJobs+1 wide":                        {Args: atkStep{Name: "a"}, Opts: rl, Then: wide(enqueue.MaxFlowJobs)},
		"a continuation's key":                      {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: &enqueue.Opts{IdempotencyKey: "k"}}}},
		"a continuation's Delay":                    {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: &enqueue.Opts{Delay: time.Second}}}},
		"a continuation's RunAt":                    {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: &enqueue.Opts{RunAt: time.Now().Add(time.Hour)}}}},
		"a continuation's Debounce":                 {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "d", Period: time.Minute}}}}},
		"the first job's Debounce":                  {Args: atkStep{Name: "a"}, Opts: &enqueue.Opts{Debounce: &enqueue.Debounce{Key: "d", Period: time.Minute}}, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: rl}}},
		"a Join over one":                           {Args: atkStep{Name: "a"}, Opts: rl, Then: wide(1), Join: &enqueue.Flow{Args: atkStep{Name: "j"}}},
		"a Join over none":                          {Args: atkStep{Name: "a"}, Opts: rl, Join: &enqueue.Flow{Args: atkStep{Name: "j"}}},
		"a Join over MaxParents+1":                  {Args: atkStep{Name: "a"}, Opts: rl, Then: wide(ledger.MaxParents + 1), Join: &enqueue.Flow{Args: atkStep{Name: "j"}}},
		"a deep bad Join":                           {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Then: wide(1), Join: &enqueue.Flow{Args: atkStep{Name: "j"}}}}},
		"a deep continuation's key":                 {Args: atkStep{Name: "a"}, Opts: rl, Then: wide(2), Join: &enqueue.Flow{Args: atkStep{Name: "j"}, Then: []enqueue.Flow{{Args: atkStep{Name: "k"}, Opts: &enqueue.Opts{IdempotencyKey: "deep"}}}}},
		"huge args on a continuation":               {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{Args: atkStep{Name: "b", Pad: huge}}}},
		"nil args on a continuation":                {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{}}},
		"nil args first":                            {Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: rl}}},
		"a continuation's policy":                   {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: &enqueue.Opts{DuplicatePolicy: enqueue.RejectAlways}}}},
		"a continuation's unknown queue":            {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: &enqueue.Opts{Queue: "nope"}}}},
		"a bad RateLimit deep":                      {Args: atkStep{Name: "a"}, Opts: rl, Then: wide(2), Join: &enqueue.Flow{Args: atkStep{Name: "j"}, Opts: &enqueue.Opts{RateLimit: &enqueue.RateLimit{Key: "", Limit: 1, Period: time.Hour}}}},
		"a continuation's RequestID":                {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: &enqueue.Opts{RequestID: "r"}}}},
		"a continuation with a deadline before now": {Args: atkStep{Name: "a"}, Opts: rl, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: &enqueue.Opts{Deadline: time.Now().Add(-time.Hour)}}}},
	}
	for name, f := range cases {
		_, err := c.EnqueueFlow(ctx, f)
		var in *enqueue.InputError
		if !errors.As(err, &in) {
			t.Errorf("%s: %v; want an *InputError", name, err)
		}
		if recs := e.Records(t); len(recs) != 0 {
			t.Errorf("%s: %d items written by a refused flow (%+v)", name, len(recs), recs[0])
		}
	}
	checkMessages(t, e, 0)
}

// TestAttackFlowKeyByArgsContinuation: "Continuations take no key of
// their own (the flow's is the first job's: an *InputError)". A
// continuation whose kind keys it by its args (Defaults.KeyByArgs) has a
// key of its own: refused, not silently written without it.
func TestAttackFlowKeyByArgsContinuation(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	_, err := c.EnqueueFlow(context.Background(), enqueue.Flow{
		Args: atkStep{Name: "a"}, Then: []enqueue.Flow{{Args: atkByArgs{Name: "b"}}},
	})
	var in *enqueue.InputError
	if !errors.As(err, &in) {
		t.Errorf("a continuation keyed by its kind's KeyByArgs: %v; want an *InputError", err)
	}
	if n := len(e.Records(t)); n != 0 {
		t.Errorf("%d items written", n)
	}
}

// TestAttackFlowMaxJobs: exactly MaxFlowJobs jobs are accepted, in one
// transaction, also when the first job's key is held by an ended job
// ("100 items, two of which may move aside the ended holder").
func TestAttackFlowMaxJobs(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	old := stage(t, c, "max-flow", ledger.Failed, time.Now().Add(time.Hour))
	var then []enqueue.Flow
	for range enqueue.MaxFlowJobs - 1 {
		then = append(then, enqueue.Flow{Args: atkStep{Name: "t"}})
	}
	res, err := c.EnqueueFlow(ctx, enqueue.Flow{Args: atkStep{Name: "a"}, Opts: &enqueue.Opts{IdempotencyKey: "max-flow"}, Then: then})
	if err != nil || res.Duplicate || len(res.Then) != enqueue.MaxFlowJobs-1 {
		t.Fatalf("a flow of MaxFlowJobs over an ended holder: %v (%d Then)", err, len(res.Then))
	}
	if n := jobs(t, e); n != enqueue.MaxFlowJobs+1 {
		t.Fatalf("%d jobs, want the flow's %d and the ended one", n, enqueue.MaxFlowJobs)
	}
	if rec := e.Get(t, old.ID); rec.State != ledger.Failed {
		t.Fatalf("the ended holder is %s", rec.State)
	}
}

// TestAttackFlowTransactionTooLarge: "one DynamoDB transaction writes
// them all" and "Bad input is an *InputError and nothing is written".
// DynamoDB refuses a TransactWriteItems over 4 MB (a ValidationException,
// modelled here as DynamoDB answers it, since emulators do not): a flow
// whose jobs' args add up past it can never be written, and is bad
// input, not a transaction that "did not commit".
func TestAttackFlowTransactionTooLarge(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c, ft := faultyClient(t, e)
	ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Reject, Times: faults.Forever,
		Match: func(body []byte) bool { return len(body) > 4<<20 },
		Reply: `{"__type":"com.amazon.coral.validate#ValidationException","message":"Transaction request cannot be larger than 4 MB"}`})
	pad := strings.Repeat("y", 300<<10)
	var then []enqueue.Flow
	for range 15 {
		then = append(then, enqueue.Flow{Args: atkStep{Name: "t", Pad: pad}})
	}
	_, err := c.EnqueueFlow(context.Background(), enqueue.Flow{Args: atkStep{Name: "a"}, Then: then})
	var in *enqueue.InputError
	if !errors.As(err, &in) {
		t.Errorf("a flow of 16 jobs of 300 KB (over DynamoDB's 4 MB per transaction): %v; want an *InputError", err)
	}
	if n := len(e.Records(t)); n != 0 {
		t.Errorf("%d items written", n)
	}
}

var _ = http.MethodGet
var _ = slices.Index[[]string]
