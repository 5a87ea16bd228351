package enqueue_test

// Attacks on EnqueueFlow's documented promises (go doc ./enqueue
// EnqueueFlow, Flow, FlowResult, MaxFlowJobs). Each test asserts a
// sentence of the doc; a failing one is a break.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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
	// Flaky fails its first attempt with a retryable error.
	Flaky bool `json:"flaky,omitempty"`
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
		if j.Args.Flaky && j.Attempt == 1 {
			return errors.New("transient")
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
//
// Caveat: the SDK auto-fills TransactWriteItems' ClientRequestToken, and
// real DynamoDB answers a resend within 10 minutes with the same token as
// a success; the emulator (moto) ignores the token, which is the resend
// this package's LostReply models ("a conditional write meets its own
// earlier write"), and which a backend not honouring the token gives.
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

// Opts.ReplaceEnded in a transaction: the helper found EnqueueFlow
// (and EnqueueTx, through the same prepare) ignored it silently, moving
// the ended job aside instead. Both now refuse it as bad input, with
// nothing written: only Enqueue and EnqueueMany overwrite in one put.
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
	before := len(e.Records(t))
	var in *enqueue.InputError
	_, err := c.EnqueueFlow(ctx, enqueue.Flow{
		Args: atkStep{Name: "a"}, Opts: &enqueue.Opts{IdempotencyKey: "replace-flow", ReplaceEnded: true},
		Then: []enqueue.Flow{{Args: atkStep{Name: "b"}}},
	})
	if !errors.As(err, &in) || in.Field != "ReplaceEnded" {
		t.Fatalf("EnqueueFlow with ReplaceEnded: %v, want an *InputError on ReplaceEnded", err)
	}
	if _, err := c.EnqueueTx(ctx, atkStep{Name: "a"}, &enqueue.Opts{IdempotencyKey: "replace-flow", ReplaceEnded: true}); !errors.As(err, &in) || in.Field != "ReplaceEnded" {
		t.Fatalf("EnqueueTx with ReplaceEnded: %v, want an *InputError on ReplaceEnded", err)
	}
	if after := len(e.Records(t)); after != before {
		t.Fatalf("%d records after the refusals, %d before", after, before)
	}
	if rec, err := c.Store().Get(ctx, old.ID); err != nil || rec.State != ledger.Failed {
		t.Fatalf("the ended job: %v %v, want it untouched", rec.State, err)
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
// key of its own (ContinueWith honours it): refused, not silently
// written without it.
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

// holdTx holds the next n TransactWriteItems in flight (a Pass rule's
// Before) until release is closed; arrived gets one value per request
// held.
func holdTx(ft *faults.Transport, n int) (arrived chan struct{}, release chan struct{}, h faults.Handle) {
	arrived, release = make(chan struct{}, n), make(chan struct{})
	h = ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Pass, Times: n, Before: func(*http.Request, []byte) {
		arrived <- struct{}{}
		<-release
	}})
	return arrived, release, h
}

type flowOut struct {
	res enqueue.FlowResult
	err error
}

// TestAttackFlowTwoAtOnce: two EnqueueFlow calls with one key, both
// past their read of the key (free) and both commits in flight at once.
// "while its job is active, a repeat returns it as a duplicate and
// writes nothing": one flow of 5 jobs, the other call its first job as a
// duplicate, one message.
func TestAttackFlowTwoAtOnce(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c, ft := faultyClient(t, e)
	arrived, release, _ := holdTx(ft, 2)
	outs := make(chan flowOut, 2)
	for range 2 {
		go func() {
			res, err := c.EnqueueFlow(context.Background(), atkFlow("two-at-once", false))
			outs <- flowOut{res, err}
		}()
	}
	<-arrived
	<-arrived
	close(release)
	a, b := <-outs, <-outs
	if a.err != nil || b.err != nil {
		t.Fatalf("errors: %v, %v", a.err, b.err)
	}
	if a.res.Duplicate == b.res.Duplicate || a.res.ID != b.res.ID {
		t.Fatalf("two flows of one key: %+v / %+v; want one created, the other its duplicate", a.res, b.res)
	}
	dup := a
	if b.res.Duplicate {
		dup = b
	}
	if dup.res.Then != nil || dup.res.Join != nil {
		t.Fatalf("the duplicate has Then or Join: %+v", dup.res)
	}
	if n := jobs(t, e); n != 5 {
		t.Fatalf("%d jobs, want one flow's 5", n)
	}
	checkMessages(t, e, 1)
}

// TestAttackFlowRacingEnqueue: Enqueue of the flow's key lands while the
// flow's commit is in flight (its read found the key free, or held by an
// ended job). The flow then meets an active holder: its duplicate, no
// continuation written, nothing sent by the flow.
func TestAttackFlowRacingEnqueue(t *testing.T) {
	t.Parallel()
	for _, sit := range []string{"free", "ended-holder"} {
		t.Run(sit, func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			c, ft := faultyClient(t, e)
			plain := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
			ctx := context.Background()
			key := "racing-" + sit
			base := 0
			if sit == "ended-holder" {
				old, err := plain.Enqueue(ctx, atkStep{Name: "old"}, &enqueue.Opts{IdempotencyKey: key})
				if err != nil {
					t.Fatal(err)
				}
				rec, err := plain.Store().Claim(ctx, old.ID, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := plain.Store().Finish(ctx, rec, ledger.Finish{State: ledger.Failed, LastError: "staged", ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
					t.Fatal(err)
				}
				e.Purge(t, e.QueueURL)
				base = 1
			}
			arrived, release, _ := holdTx(ft, 1)
			outs := make(chan flowOut, 1)
			go func() {
				res, err := c.EnqueueFlow(ctx, atkFlow(key, false))
				outs <- flowOut{res, err}
			}()
			<-arrived
			enq, err := plain.Enqueue(ctx, atkStep{Name: "rival"}, &enqueue.Opts{IdempotencyKey: key})
			if err != nil || enq.Duplicate {
				t.Fatalf("the rival Enqueue: %+v, %v", enq, err)
			}
			close(release)
			out := <-outs
			if out.err != nil || !out.res.Duplicate || out.res.ID != enq.ID {
				t.Fatalf("the flow after Enqueue took its key: %+v, %v; want Enqueue's job %s as a duplicate", out.res, out.err, enq.ID)
			}
			if n := jobs(t, e); n != 1+base {
				t.Fatalf("%d jobs, want %d (no continuation of a flow that was not written)", n, 1+base)
			}
			checkMessages(t, e, 1)
		})
	}
}

// TestAttackFlowEndedHolderMatrix: "after it ended, the policy decides as
// for Enqueue": the flow's first job meets each situation of the key
// under each DuplicatePolicy as Enqueue does (TestPolicyMatrix), and a
// created flow is written whole, a duplicate or a rejection writes
// nothing.
func TestAttackFlowEndedHolderMatrix(t *testing.T) {
	t.Parallel()
	for _, policy := range []ledger.DuplicatePolicy{enqueue.AllowAfterFailed, enqueue.RejectIfFailed, enqueue.RejectAlways} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
			ctx := context.Background()
			for i, sit := range situations {
				key := "flow-" + sit.name
				var first enqueue.Result
				if sit.state != "" {
					exp := time.Now().Add(time.Hour)
					if sit.past {
						exp = time.Now().Add(-time.Second)
					}
					first = stage(t, c, key, sit.state, exp)
				}
				before := jobs(t, e)
				f := atkFlow(key, false)
				f.Args = payment{OrderID: sit.name} // the holder's kind (stage's)
				f.Opts.DuplicatePolicy = policy
				res, err := c.EnqueueFlow(ctx, f)
				after := jobs(t, e)
				switch want[policy][i] {
				case existing:
					if err != nil || !res.Duplicate || res.ID != first.ID || after != before {
						t.Errorf("%s: %+v, %v, %d new jobs; want the holder %s as a duplicate, nothing written", sit.name, res.Result, err, after-before, first.ID)
					}
				case created:
					grown := 5
					if sit.past {
						grown = 4 // the record past its TTL is overwritten
					}
					if err != nil || res.Duplicate || after != before+grown {
						t.Errorf("%s: %+v, %v, %d new jobs; want a new flow of 5", sit.name, res.Result, err, after-before)
						continue
					}
					for _, id := range flowIDs(res) {
						e.Get(t, id)
					}
				case rejected:
					var dup *enqueue.DuplicateJobError
					if !errors.As(err, &dup) || dup.ExistingJobID != first.ID || after != before {
						t.Errorf("%s: %+v, %v, %d new jobs; want a *DuplicateJobError naming %s, nothing written", sit.name, res.Result, err, after-before, first.ID)
					}
				}
			}
		})
	}
}

// TestAttackFlowFastWorkerMeanwhile: flow A and flow B of one key, B's
// read done and its commit held while A commits, is sent, and its first
// job runs and fails at once (a fast worker), its continuations ending
// Failed. B then meets an ended holder: the policy decides, as for
// Enqueue (AllowAfterFailed: a new flow; RejectIfFailed: refused). Never
// a continuation of B that met its parent ended.
func TestAttackFlowFastWorkerMeanwhile(t *testing.T) {
	t.Parallel()
	for _, policy := range []ledger.DuplicatePolicy{enqueue.AllowAfterFailed, enqueue.RejectIfFailed} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			r := newAtkRig(t)
			ft, cfg := r.e.Faulty()
			cb, err := enqueue.New(cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Logger: quietLog})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			fa, fb := atkFlow("fast", true), atkFlow("fast", false)
			fa.Opts.DuplicatePolicy, fb.Opts.DuplicatePolicy = policy, policy
			arrived, release, _ := holdTx(ft, 1)
			outs := make(chan flowOut, 1)
			go func() {
				res, err := cb.EnqueueFlow(ctx, fb)
				outs <- flowOut{res, err}
			}()
			<-arrived
			a, err := r.e.Client.EnqueueFlow(ctx, fa)
			if err != nil || a.Duplicate {
				t.Fatalf("flow A: %+v, %v", a, err)
			}
			r.e.Drain(t, r.h)
			r.e.RequireState(t, a.ID, ledger.Failed)
			close(release)
			b := <-outs
			switch policy {
			case enqueue.AllowAfterFailed:
				if b.err != nil || b.res.Duplicate || b.res.ID == a.ID {
					t.Fatalf("flow B after A failed: %+v, %v; want a new flow", b.res, b.err)
				}
				r.e.Drain(t, r.h)
				for _, id := range flowIDs(b.res) {
					r.e.RequireState(t, id, ledger.Succeeded)
				}
			case enqueue.RejectIfFailed:
				var dup *enqueue.DuplicateJobError
				if !errors.As(b.err, &dup) || dup.ExistingJobID != a.ID {
					t.Fatalf("flow B after A failed: %+v, %v; want a *DuplicateJobError naming %s", b.res, b.err, a.ID)
				}
				if n := jobs(t, r.e); n != 5 {
					t.Fatalf("%d jobs; want A's 5", n)
				}
			}
		})
	}
}

// TestAttackFlowWorkerOrder: "Then run once the job Succeeded ... Join
// ... runs once every one of them Succeeded". A deep flow with two
// fan-ins, one under the other: every job runs after each of its
// parents, each once.
func TestAttackFlowWorkerOrder(t *testing.T) {
	t.Parallel()
	r := newAtkRig(t)
	ctx := context.Background()
	s := func(n string) enqueue.JobArgs { return atkStep{Name: n} }
	f := enqueue.Flow{Args: s("a"), Opts: &enqueue.Opts{Delay: 5 * time.Second},
		Then: []enqueue.Flow{
			{Args: s("b"), Then: []enqueue.Flow{{Args: s("b1"), Then: []enqueue.Flow{{Args: s("b11")}}}}},
			{Args: s("c")},
			{Args: s("x")},
		},
		Join: &enqueue.Flow{Args: s("d"),
			Then: []enqueue.Flow{{Args: s("f")}, {Args: s("g"), Then: []enqueue.Flow{{Args: s("g1")}}}},
			Join: &enqueue.Flow{Args: s("h"), Then: []enqueue.Flow{{Args: s("i")}}},
		},
	}
	res, err := r.e.Client.EnqueueFlow(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, r.h)
	for _, id := range flowIDs(res) {
		r.e.RequireState(t, id, ledger.Succeeded)
	}
	parents := map[string][]string{"b": {"a"}, "c": {"a"}, "x": {"a"}, "b1": {"b"}, "b11": {"b1"}, "d": {"b", "c", "x"},
		"f": {"d"}, "g": {"d"}, "g1": {"g"}, "h": {"f", "g"}, "i": {"h"}}
	if len(r.ran) != 12 {
		t.Fatalf("ran %v; want 12 runs, one each", r.ran)
	}
	for child, ps := range parents {
		for _, p := range ps {
			if slices.Index(r.ran, child) < slices.Index(r.ran, p) {
				t.Errorf("ran %v: %s before its parent %s", r.ran, child, p)
			}
		}
	}
}

// TestAttackFlowWorkerFailedBranch: one parent of a fan-in fails, the
// other succeeds: the Join and everything under it end Failed, never
// run ("end Failed under a failed parent"); the other branch runs.
func TestAttackFlowWorkerFailedBranch(t *testing.T) {
	t.Parallel()
	r := newAtkRig(t)
	ctx := context.Background()
	f := enqueue.Flow{Args: atkStep{Name: "a"},
		Then: []enqueue.Flow{{Args: atkStep{Name: "b", Fail: true}, Then: []enqueue.Flow{{Args: atkStep{Name: "b1"}}}}, {Args: atkStep{Name: "c"}, Then: []enqueue.Flow{{Args: atkStep{Name: "c1"}}}}},
		Join: &enqueue.Flow{Args: atkStep{Name: "d"}, Then: []enqueue.Flow{{Args: atkStep{Name: "e"}}}},
	}
	res, err := r.e.Client.EnqueueFlow(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	r.e.Drain(t, r.h)
	r.e.RequireState(t, res.ID, ledger.Succeeded)
	r.e.RequireState(t, res.Then[0].ID, ledger.Failed)
	r.e.RequireState(t, res.Then[1].ID, ledger.Succeeded)
	r.e.RequireState(t, res.Then[1].Then[0].ID, ledger.Succeeded)
	for _, id := range []string{res.Then[0].Then[0].ID, res.Join.ID, res.Join.Then[0].ID} {
		if rec := r.e.RequireState(t, id, ledger.Failed); rec.Attempt != 0 {
			t.Errorf("%s ran (attempt %d) under a failed parent", id, rec.Attempt)
		}
	}
	for _, n := range []string{"b1", "d", "e"} {
		if slices.Contains(r.ran, n) {
			t.Errorf("ran %v: %s ran under a failed parent", r.ran, n)
		}
	}
}

// TestAttackFlowDispatchError: "a send that fails is a *DispatchError
// with the flow recorded, its first job marked unsent (the dispatch
// guard sends it), as for Enqueue": the flow is whole, the first job
// marked Undispatched; a caller's retry of the key re-sends it
// (Redispatched) and the flow runs to the end.
func TestAttackFlowDispatchError(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"throttled", "context ended after the commit"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			r := newAtkRig(t)
			ft, cfg := r.e.Faulty()
			c, err := enqueue.New(cfg, r.e.Table, r.e.QueueURL, &enqueue.ClientOptions{Logger: quietLog})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			switch how {
			case "throttled":
				ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.Throttle, Times: faults.Attempts})
			default:
				ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Pass, After: cancel})
			}
			res, err := c.EnqueueFlow(ctx, atkFlow("dispatch-"+strings.Fields(how)[0], false))
			var de *enqueue.DispatchError
			if !errors.As(err, &de) || de.JobID != res.ID || res.ID == "" {
				t.Fatalf("a failed send: %+v, %v; want a *DispatchError naming the first job", res, err)
			}
			if len(res.Then) != 2 || res.Join == nil {
				t.Fatalf("the flow's result lost its continuations: %+v", res)
			}
			for _, id := range flowIDs(res) {
				r.e.Get(t, id)
			}
			if rec := r.e.Get(t, res.ID); !rec.Undispatched || rec.State != ledger.Enqueued {
				t.Fatalf("the first job after a failed send: %s, undispatched=%v; want Enqueued and marked", rec.State, rec.Undispatched)
			}
			checkMessages(t, r.e, 0)
			again, err := r.e.Client.EnqueueFlow(context.Background(), atkFlow("dispatch-"+strings.Fields(how)[0], false))
			if err != nil || !again.Duplicate || !again.Redispatched || again.ID != res.ID {
				t.Fatalf("the caller's retry: %+v, %v; want the duplicate, re-sent", again, err)
			}
			r.e.Drain(t, r.h)
			for _, id := range flowIDs(res) {
				r.e.RequireState(t, id, ledger.Succeeded)
			}
		})
	}
}

// TestAttackFlowThrottledCommit: throttled past the retries, or a
// cancellation on a continuation's item: ErrTxNotCommitted and nothing
// at all written ("none of them exists without the others"), no
// message.
func TestAttackFlowThrottledCommit(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"throttle", "conflict on a continuation"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := awstest.New(t, nil)
			c, ft := faultyClient(t, e)
			switch how {
			case "throttle":
				ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Throttle, Times: faults.Attempts})
			default:
				ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Reject, Times: faults.Forever,
					Reply: `{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","message":"Transaction cancelled, please refer cancellation reasons for specific reasons [None, TransactionConflict, None, None, None]","CancellationReasons":[{"Code":"None"},{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"},{"Code":"None"},{"Code":"None"},{"Code":"None"}]}`})
			}
			_, err := c.EnqueueFlow(context.Background(), atkFlow("throttled", false))
			if !errors.Is(err, enqueue.ErrTxNotCommitted) {
				t.Fatalf("%v; want ErrTxNotCommitted", err)
			}
			if n := len(e.Records(t)); n != 0 {
				t.Fatalf("%d items written", n)
			}
			checkMessages(t, e, 0)
		})
	}
}

// TestAttackFlowConflictOnKey: the first job's item cancelled by a
// TransactionConflict (a concurrent write of the key) on every try: the
// flow decides again a bounded number of times, then fails; nothing is
// written, nothing sent.
func TestAttackFlowConflictOnKey(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c, ft := faultyClient(t, e)
	h := ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Reject, Times: faults.Forever,
		Reply: `{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","message":"Transaction cancelled, please refer cancellation reasons for specific reasons [TransactionConflict, None, None, None, None]","CancellationReasons":[{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"},{"Code":"None"},{"Code":"None"},{"Code":"None"},{"Code":"None"}]}`})
	_, err := c.EnqueueFlow(context.Background(), atkFlow("conflict", false))
	if err == nil || h.Fired() == 0 {
		t.Fatalf("%v (fired %d); want an error", err, h.Fired())
	}
	if n := len(e.Records(t)); n != 0 {
		t.Fatalf("%d items written", n)
	}
	checkMessages(t, e, 0)
	// Once the conflict is over, the same flow goes through.
	h.Remove()
	if res, err := c.EnqueueFlow(context.Background(), atkFlow("conflict", false)); err != nil || res.Duplicate {
		t.Fatalf("after the conflict: %+v, %v", res, err)
	}
	if n := jobs(t, e); n != 5 {
		t.Fatalf("%d jobs", n)
	}
}

// TestAttackFlowWorkerRetriedParent: a fan-in parent whose first attempt
// fails (retried after its backoff) holds the Join back until it
// Succeeded: "Join ... runs once every one of them Succeeded".
func TestAttackFlowWorkerRetriedParent(t *testing.T) {
	t.Parallel()
	r := newAtkRig(t)
	f := enqueue.Flow{Args: atkStep{Name: "a"},
		Then: []enqueue.Flow{{Args: atkStep{Name: "b", Flaky: true}}, {Args: atkStep{Name: "c"}}},
		Join: &enqueue.Flow{Args: atkStep{Name: "d"}},
	}
	res, err := r.e.Client.EnqueueFlow(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	r.e.DrainNow(t, r.h)
	if rec := r.e.Get(t, res.Join.ID); rec.State != ledger.AwaitingContinuation {
		t.Fatalf("the Join while b waits for its retry: %s (ran %v)", rec.State, r.ran)
	}
	r.e.Drain(t, r.h)
	for _, id := range flowIDs(res) {
		r.e.RequireState(t, id, ledger.Succeeded)
	}
	if want := []string{"a", "b", "c", "b", "d"}; !slices.Equal(r.ran, want) && !slices.Equal(r.ran, []string{"a", "c", "b", "b", "d"}) {
		t.Fatalf("ran %v; want d once, after b's second attempt", r.ran)
	}
}

// TestAttackFlowWideAndDeep: a Join of ledger.MaxParents parents, and a
// chain of MaxFlowJobs jobs, run to the end in order, each job once.
func TestAttackFlowWideAndDeep(t *testing.T) {
	t.Parallel()
	t.Run("wide", func(t *testing.T) {
		t.Parallel()
		r := newAtkRig(t)
		var then []enqueue.Flow
		for i := range ledger.MaxParents {
			then = append(then, enqueue.Flow{Args: atkStep{Name: fmt.Sprint("p", i)}})
		}
		res, err := r.e.Client.EnqueueFlow(context.Background(), enqueue.Flow{Args: atkStep{Name: "a"}, Then: then, Join: &enqueue.Flow{Args: atkStep{Name: "join"}}})
		if err != nil {
			t.Fatal(err)
		}
		r.e.Drain(t, r.h)
		r.e.RequireState(t, res.Join.ID, ledger.Succeeded)
		if len(r.ran) != ledger.MaxParents+2 || r.ran[len(r.ran)-1] != "join" {
			t.Fatalf("ran %v; want the join once, last", r.ran)
		}
	})
	t.Run("deep", func(t *testing.T) {
		t.Parallel()
		r := newAtkRig(t)
		f := enqueue.Flow{Args: atkStep{Name: fmt.Sprint(enqueue.MaxFlowJobs - 1)}}
		for i := enqueue.MaxFlowJobs - 2; i >= 0; i-- {
			f = enqueue.Flow{Args: atkStep{Name: fmt.Sprint(i)}, Then: []enqueue.Flow{f}}
		}
		if _, err := r.e.Client.EnqueueFlow(context.Background(), f); err != nil {
			t.Fatal(err)
		}
		r.e.Drain(t, r.h)
		if len(r.ran) != enqueue.MaxFlowJobs {
			t.Fatalf("ran %d jobs, want %d", len(r.ran), enqueue.MaxFlowJobs)
		}
		for i, n := range r.ran {
			if n != fmt.Sprint(i) {
				t.Fatalf("ran %v: out of order at %d", r.ran, i)
			}
		}
	})
}

// TestAttackFlowBigArgs: jobs at the largest args a record takes, a fan-in
// of MaxParents parents among them (its record names them all), and a
// first job naming MaxFlowJobs-1 continuations, are written and run.
func TestAttackFlowBigArgs(t *testing.T) {
	t.Parallel()
	r := newAtkRig(t)
	big := func(name string) atkStep {
		s := atkStep{Name: name}
		raw, _ := json.Marshal(s)
		s.Pad = strings.Repeat("z", ledger.MaxArgsBytes-len(raw)-len(`,"pad":""`))
		return s
	}
	var then []enqueue.Flow
	for i := range ledger.MaxParents {
		then = append(then, enqueue.Flow{Args: atkStep{Name: fmt.Sprint("p", i)}})
	}
	f := enqueue.Flow{Args: big("a"), Opts: &enqueue.Opts{IdempotencyKey: "big"}, Then: then,
		Join: &enqueue.Flow{Args: big("join"), Then: []enqueue.Flow{{Args: atkStep{Name: "after"}}}}}
	res, err := r.e.Client.EnqueueFlow(context.Background(), f)
	if err != nil {
		t.Fatalf("big args: %v", err)
	}
	r.e.Drain(t, r.h)
	for _, id := range flowIDs(res) {
		r.e.RequireState(t, id, ledger.Succeeded)
	}
}

// TestAttackFlowRateLimitedContinuation: "A RateLimit on any job takes
// its slot before the commit": a continuation over its limit refuses
// the whole flow with a *RateLimitedError, no job written, nothing sent.
func TestAttackFlowRateLimitedContinuation(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	one := &enqueue.Opts{RateLimit: &enqueue.RateLimit{Key: "cont", Limit: 1, Period: time.Hour}}
	f := enqueue.Flow{Args: atkStep{Name: "a"}, Then: []enqueue.Flow{{Args: atkStep{Name: "b"}, Opts: one}, {Args: atkStep{Name: "c"}, Opts: one}}}
	_, err := c.EnqueueFlow(context.Background(), f)
	limited(t, "a flow of two continuations under a limit of one", err)
	if n := jobs(t, e); n != 0 {
		t.Fatalf("%d jobs written by a refused flow", n)
	}
	checkMessages(t, e, 0)
}

// TestArgsKeyPrefixIsThePackages: a key beginning "nexjob-args:" taken
// first with other args would make a KeyByArgs job a duplicate of a job
// it is not: such a key is refused, and the KeyByArgs job of those args
// is enqueued as its own.
func TestArgsKeyPrefixIsThePackages(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{Logger: quietLog})
	ctx := context.Background()
	// The key KeyByArgs gives atkByArgs{Name: "ann"}, as a forger works it out.
	sum := sha256.Sum256([]byte("atk-byargs\x00" + `{"Name":"ann"}`))
	forged := "nexjob-args:atk-byargs:" + hex.EncodeToString(sum[:16])
	for _, raw := range []string{forged, "nexjob-args:"} {
		_, err := c.Enqueue(ctx, atkByArgs{Name: "mallory"}, &enqueue.Opts{IdempotencyKey: raw})
		var in *enqueue.InputError
		if !errors.As(err, &in) || in.Field != "IdempotencyKey" || !strings.Contains(in.Error(), "package's own") {
			t.Errorf("a key %q of the caller's: %v; want an *InputError on IdempotencyKey", raw, err)
		}
	}
	first, err := c.Enqueue(ctx, atkByArgs{Name: "ann"}, nil)
	if err != nil || first.Duplicate {
		t.Fatalf("the KeyByArgs job after the forgery: %+v, %v; want a job of its own", first, err)
	}
	again, err := c.Enqueue(ctx, atkByArgs{Name: "ann"}, nil)
	if err != nil || !again.Duplicate || again.ID != first.ID {
		t.Errorf("the same args again: %+v, %v; want the first job as a duplicate", again, err)
	}
	if n := jobs(t, e); n != 1 {
		t.Errorf("%d jobs, want the one KeyByArgs job", n)
	}
}
