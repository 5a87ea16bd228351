package handler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Attacks on child jobs' promises (handler.Invoke, docs/durable-jobs.md
// "Child jobs with results").

type ckKid struct {
	Name  string `json:"name"`
	Mode  string `json:"mode,omitempty"`  // "", "fail", "sleep"
	Sleep int64  `json:"sleep,omitempty"` // "sleep": how long (ns)
}

type ckCaller struct {
	Kids    []ckKid `json:"kids"`
	Timeout int64   `json:"timeout,omitempty"` // the wait's (ns), 24 h when 0
}

func (ckCaller) Kind() string { return "atk-caller" }

type ckChild struct {
	N     int    `json:"n"`
	Mode  string `json:"mode,omitempty"`
	Sleep int64  `json:"sleep,omitempty"`
}

func (ckChild) Kind() string { return "atk-child" }

type childRig struct {
	e        *nexjobtest.Env
	h        *handler.Handler
	ft       *faults.Transport
	mu       sync.Mutex
	runs     map[string]int // "child <n>" → runs that got past its sleep; "caller <id>" → runs
	got      map[string][]label
	errs     map[string]error
	attempts map[string][]int // caller id → Job.Attempt of each run
}

func newChildRig(t *testing.T) *childRig {
	t.Helper()
	r := &childRig{e: nexjobtest.New(t, nil), runs: map[string]int{}, got: map[string][]label{}, errs: map[string]error{}, attempts: map[string][]int{}}
	r.ft = faults.New(nil)
	r.e.Cfg = faults.Config(r.e.Cfg, r.ft)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[ckCaller](func(ctx context.Context, j *handler.Job[ckCaller]) error {
		r.mu.Lock()
		r.runs["caller "+j.ID]++
		r.attempts[j.ID] = append(r.attempts[j.ID], j.Attempt)
		r.mu.Unlock()
		var cs []handler.Child
		for i, k := range j.Args.Kids {
			c, err := handler.InvokeAsync(ctx, k.Name, ckChild{N: i, Mode: k.Mode, Sleep: k.Sleep}, nil)
			if err != nil {
				r.mu.Lock()
				r.errs[j.ID] = err
				r.mu.Unlock()
				return err
			}
			cs = append(cs, c)
		}
		timeout := time.Duration(j.Args.Timeout)
		if timeout == 0 {
			timeout = 24 * time.Hour
		}
		got, err := handler.AwaitAll[label](ctx, cs, timeout)
		if handler.IsSleep(err) {
			return err
		}
		r.mu.Lock()
		r.got[j.ID], r.errs[j.ID] = got, err
		r.mu.Unlock()
		return nil
	}), nil)
	handler.AddWorkerResult(reg, handler.ResultFunc[ckChild, label](func(ctx context.Context, j *handler.Job[ckChild]) (label, error) {
		if j.Args.Mode == "sleep" {
			if err := handler.Sleep(ctx, "nap", time.Duration(j.Args.Sleep)); err != nil {
				return label{}, err
			}
		}
		r.mu.Lock()
		r.runs[fmt.Sprintf("child %d", j.Args.N)]++
		r.mu.Unlock()
		if j.Args.Mode == "fail" {
			return label{}, handler.Permanent(errors.New("no carrier"))
		}
		return label{Tracking: fmt.Sprintf("TRK-%d", j.Args.N)}, nil
	}), nil)
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	return r
}

func (r *childRig) ran(k string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[k]
}

func (r *childRig) result(id string) ([]label, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[id], r.errs[id]
}

// kid is the id of the child the caller started under name.
func (r *childRig) kid(t *testing.T, caller, name string) string {
	t.Helper()
	rec := r.e.Get(t, caller)
	v, ok := rec.Steps[ledger.InvokeStep(name)]
	if !ok {
		t.Fatalf("caller %s started no child %q (steps %v)", caller, name, rec.Steps)
	}
	var id string
	if err := json.Unmarshal([]byte(v), &id); err != nil {
		t.Fatal(err)
	}
	return id
}

// A name of 128 bytes (the limit the docs give) works; 129 bytes are
// refused with nothing enqueued.
func TestChildAttackNameOf128Bytes(t *testing.T) {
	t.Parallel()
	for _, name := range []string{strings.Repeat("n", 128), strings.Repeat("n", 129)} {
		r := newChildRig(t)
		id := enqueueOne(t, r.e.Client, ckCaller{Kids: []ckKid{{Name: name}}}, nil)
		r.e.Drain(t, r.h)
		rec := r.e.Get(t, id)
		got, err := r.result(id)
		var se *ledger.StepError
		switch ok := len(name) <= ledger.MaxStepName && utf8.ValidString(name); {
		case ok && (rec.State != ledger.Succeeded || err != nil || len(got) != 1 || got[0].Tracking != "TRK-0"):
			t.Errorf("a %d-byte name: caller %s (%s), %v, %v", len(name), rec.State, rec.LastError, got, err)
		case !ok && (rec.State != ledger.Failed || !errors.As(err, &se) || len(r.e.Scan(t)) != 1):
			t.Errorf("name %q: caller %s, %v, %d records; want Failed by a *StepError and no child", name, rec.State, err, len(r.e.Scan(t)))
		}
	}
}

// childRunsFirst has the caller's sleep in its wait for children (its
// record's write with awaitEnd) held until every child due ran to its
// end: the children end while the caller still runs, after its look at
// its steps. The hold long-polls (a child whose send waits for the
// dispatch guard, as a busy machine's slow send may, comes in later), up
// to 120 polls, and names each child's state if they never end.
func (r *childRig) childRunsFirst(t *testing.T, n int) faults.Handle {
	return r.ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Pass,
		Match: func(b []byte) bool { return strings.Contains(string(b), ledger.AttrAwaitEnd) },
		Before: func(*http.Request, []byte) {
			p := poller.New(r.e.SQS, r.e.QueueURL, r.h.Handle, &poller.Options{WaitTime: time.Second})
			var kids []string
			for range 120 {
				if _, err := p.Poll(context.Background()); err != nil {
					t.Error(err)
					return
				}
				ended := 0
				kids = kids[:0]
				for _, rec := range r.e.Scan(t) {
					if rec.Kind == "atk-child" {
						kids = append(kids, fmt.Sprintf("%s %s attempt %d run at %v last error %q", rec.ID, rec.State, rec.Attempt, ledger.Millis(rec.RunAt), rec.LastError))
						if rec.State.Terminal() {
							ended++
						}
					}
				}
				if ended == n {
					return
				}
			}
			t.Errorf("the children did not end in 120 polls: %q", kids)
		}})
}

// Children that end while their caller runs, between its look at its
// steps and its sleep, wake it: it does not sleep to its wait's end.
func TestChildAttackChildrenEndBeforeTheCallerSleeps(t *testing.T) {
	t.Parallel()
	r := newChildRig(t)
	held := r.childRunsFirst(t, 3)
	start := r.e.Now()
	id := enqueueOne(t, r.e.Client, ckCaller{Kids: []ckKid{{Name: "a"}, {Name: "b"}, {Name: "c"}}}, nil)
	r.e.Drain(t, r.h)
	got, err := r.result(id)
	if held.Fired() != 1 || err != nil || len(got) != 3 || got[2].Tracking != "TRK-2" {
		t.Fatalf("hold fired %d; caller read %v, %v; want the 3 labels", held.Fired(), got, err)
	}
	if waited := r.e.Now().Sub(start); waited > time.Hour {
		t.Fatalf("the caller woke %s later: it slept to its wait's end", waited)
	}
	if rec := r.e.Get(t, id); rec.Attempt != 1 || rec.ChildEnds != 3 {
		t.Fatalf("caller at attempt %d with %d child ends; want 1 and 3", rec.Attempt, rec.ChildEnds)
	}
}

// A child's message delivered again after its end, and a forged body
// naming the caller: nothing counted twice, the outcome unchanged, the
// child not run again, no attempt spent.
func TestChildAttackDuplicateAndForgedDeliveries(t *testing.T) {
	t.Parallel()
	r := newChildRig(t)
	id := enqueueOne(t, r.e.Client, ckCaller{Kids: []ckKid{{Name: "a"}, {Name: "b", Mode: "sleep", Sleep: int64(2 * time.Hour)}}}, nil)
	r.e.Drain(t, r.h)
	a := r.kid(t, id, "a")
	send := func(jobID, kind string) {
		body := fmt.Sprintf(`{"v":1,"id":%q,"kind":%q}`, jobID, kind)
		if _, err := r.e.SQS.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(r.e.QueueURL), MessageBody: aws.String(body)}); err != nil {
			t.Fatal(err)
		}
	}
	send(a, "atk-child") // while the caller sleeps for b
	r.e.Drain(t, r.h)
	send(id, "atk-caller") // a forged wake
	r.e.Drain(t, r.h)
	r.e.Advance(t, 2*time.Hour+time.Minute)
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	got, err := r.result(id)
	if rec.State != ledger.Succeeded || err != nil || len(got) != 2 || got[0].Tracking != "TRK-0" || got[1].Tracking != "TRK-1" {
		b := r.e.Get(t, r.kid(t, id, "b"))
		t.Fatalf("caller %s (run at %v, await end %d, ends %d), read %v, %v; b %s at %v, now %v", rec.State, ledger.Millis(rec.RunAt), rec.AwaitEnd, rec.ChildEnds, got, err, b.State, ledger.Millis(b.RunAt), r.e.Now())
	}
	if rec.ChildEnds != 2 || rec.Attempt != 1 || r.ran("child 0") != 1 || r.ran("child 1") != 1 {
		t.Fatalf("caller counted %d ends at attempt %d; children ran %d and %d times", rec.ChildEnds, rec.Attempt, r.ran("child 0"), r.ran("child 1"))
	}
	send(a, "atk-child") // after the caller's end
	r.e.Drain(t, r.h)
	if after := r.e.Get(t, id); after.ChildEnds != 2 || after.Steps[ledger.ChildStep(a)] != rec.Steps[ledger.ChildStep(a)] {
		t.Fatalf("after a late duplicate: %d ends, outcome %q", after.ChildEnds, after.Steps[ledger.ChildStep(a)])
	}
}

// The caller is woken by each of several children, sleeping between: no
// attempt spent on any wait.
func TestChildAttackAttemptUnchangedAcrossWaits(t *testing.T) {
	t.Parallel()
	r := newChildRig(t)
	id := enqueueOne(t, r.e.Client, ckCaller{Kids: []ckKid{
		{Name: "a", Mode: "sleep", Sleep: int64(time.Hour)},
		{Name: "b", Mode: "sleep", Sleep: int64(2 * time.Hour)},
		{Name: "c", Mode: "sleep", Sleep: int64(3 * time.Hour)},
	}}, nil)
	for range 4 {
		r.e.Drain(t, r.h)
		r.e.Advance(t, time.Hour+time.Minute)
	}
	rec := r.e.Get(t, id)
	r.mu.Lock()
	attempts := r.attempts[id]
	r.mu.Unlock()
	if rec.State != ledger.Succeeded || rec.Attempt != 1 || len(attempts) < 4 {
		t.Fatalf("caller %s at attempt %d after runs %v", rec.State, rec.Attempt, attempts)
	}
	for _, a := range attempts {
		if a != 1 {
			t.Fatalf("runs at attempts %v, want all 1", attempts)
		}
	}
}

// forgeChild calls Client.EnqueueChild as code outside the module can:
// with whatever value of its caller parameter's type it can make (a
// ledger.Record naming victim, when that is the type; the zero value
// otherwise).
func forgeChild(c *enqueue.Client, victim, name string, args enqueue.JobArgs) error {
	m := reflect.ValueOf(c).MethodByName("EnqueueChild")
	if !m.IsValid() {
		return nil // no such method: nothing to forge with
	}
	caller := reflect.New(m.Type().In(1)).Elem()
	if rec, ok := caller.Addr().Interface().(*ledger.Record); ok {
		rec.ID = victim
	}
	out := m.Call([]reflect.Value{reflect.ValueOf(context.Background()), caller, reflect.ValueOf(name), reflect.ValueOf(args), reflect.Zero(m.Type().In(4))})
	err, _ := out[1].Interface().(error)
	return err
}

// A user who can enqueue must not make a caller read a child of the
// user's making: neither by enqueueing a child that names the caller (the
// exported EnqueueChild) nor by taking the child's idempotency key first.
func TestChildAttackForgedChildIsNotRead(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"EnqueueChild", "key"} {
		r := newChildRig(t)
		id := enqueueOne(t, r.e.Client, ckCaller{Kids: []ckKid{{Name: "k0"}}}, nil)
		var err error
		switch how {
		case "EnqueueChild":
			err = forgeChild(r.e.Client, id, "k0", ckChild{N: 99})
		case "key":
			_, err = r.e.Client.Enqueue(context.Background(), ckChild{N: 99}, &enqueue.Opts{IdempotencyKey: "nexjob-child:" + id + ":k0"})
		}
		r.e.Drain(t, r.h)
		got, werr := r.result(id)
		if len(got) != 1 || got[0].Tracking != "TRK-0" || werr != nil {
			t.Errorf("forged by %s (its enqueue's error: %v): the caller read %v, %v; want its own child's TRK-0", how, err, got, werr)
		}
		if !errors.Is(err, enqueue.ErrInvalidInput) {
			t.Errorf("forged by %s: the enqueue gave %v, want a refusal (enqueue.ErrInvalidInput)", how, err)
		}
	}
}

// A cancel that reaches the caller while a replay runs (a child's end
// woke it; the replay writes no step before it sleeps again) is not
// lost: the caller ends cancelled, its unfinished child with it, whose
// end is recorded in the caller.
func TestChildAttackCancelDuringAReplay(t *testing.T) {
	t.Parallel()
	r := newChildRig(t)
	id := enqueueOne(t, r.e.Client, ckCaller{Kids: []ckKid{{Name: "a", Mode: "sleep", Sleep: int64(time.Hour)}, {Name: "b", Mode: "sleep", Sleep: int64(5 * time.Hour)}}}, nil)
	r.e.Drain(t, r.h) // both children asleep, the caller in its wait
	var cancelErr error
	hook := r.ft.Add(faults.Rule{Op: "DynamoDB.Query", Fault: faults.Pass,
		Match: func(b []byte) bool { return strings.Contains(string(b), id) },
		Before: func(*http.Request, []byte) {
			_, cancelErr = r.e.Client.Cancel(context.Background(), id, "", 0)
		}})
	r.e.Advance(t, time.Hour+time.Minute) // a ends and wakes the caller, whose replay loads its steps
	r.e.Drain(t, r.h)
	var asked *enqueue.CancelRequestedError
	if hook.Fired() != 1 || !errors.As(cancelErr, &asked) {
		t.Fatalf("the hook fired %d times; Cancel: %v", hook.Fired(), cancelErr)
	}
	r.e.Advance(t, 5*time.Hour) // b's nap ends, if it was not cancelled
	r.e.Drain(t, r.h)
	rec := r.e.Get(t, id)
	b := r.kid(t, id, "b")
	child := r.e.Get(t, b)
	if rec.State != ledger.Failed || !rec.Cancelled || child.State != ledger.Failed || !child.Cancelled || r.ran("child 1") != 0 {
		t.Fatalf("caller %s cancelled=%v; child b %s cancelled=%v, ran %d", rec.State, rec.Cancelled, child.State, child.Cancelled, r.ran("child 1"))
	}
	if o := rec.Steps[ledger.ChildStep(b)]; !strings.Contains(o, `"cancelled":true`) {
		t.Fatalf("b's end in the caller: %q", o)
	}
}

// An operator cancels a child asleep beyond its caller's wait; the
// child's end in the caller throttled past the SDK's retries: the
// caller still reads the cancel, not its wait's timeout.
func TestChildAttackCancelledChildsEndThrottled(t *testing.T) {
	t.Parallel()
	r := newChildRig(t)
	id := enqueueOne(t, r.e.Client, ckCaller{Timeout: int64(time.Hour), Kids: []ckKid{{Name: "a", Mode: "sleep", Sleep: int64(5 * time.Hour)}}}, nil)
	r.e.Drain(t, r.h) // the child asleep for 5 h, the caller waits 1 h
	a := r.kid(t, id, "a")
	thr := r.ft.Add(faults.Rule{Op: "DynamoDB.TransactWriteItems", Fault: faults.Throttle, Times: 4,
		Match: func(b []byte) bool { return strings.Contains(string(b), ledger.AttrChildEnds) }})
	_, cerr := r.h.Producer().Cancel(context.Background(), a, "", 0)
	r.e.Drain(t, r.h)
	r.e.Advance(t, time.Hour+time.Minute)
	r.e.Drain(t, r.h)
	_, err := r.result(id)
	var failed *handler.ChildFailedError
	if thr.Fired() != 4 || !errors.As(err, &failed) || !failed.Cancelled {
		t.Fatalf("throttled %d (Cancel: %v); the caller read %v, want the child's cancel", thr.Fired(), cerr, err)
	}
}

// Cancelling a caller whose look at its children is throttled past the
// SDK's retries still cancels them before they run on.
func TestChildAttackCancelledCallersChildrenThrottled(t *testing.T) {
	t.Parallel()
	r := newChildRig(t)
	id := enqueueOne(t, r.e.Client, ckCaller{Kids: []ckKid{{Name: "a", Mode: "sleep", Sleep: int64(time.Hour)}}}, nil)
	r.e.Drain(t, r.h) // the child asleep for 1 h, the caller waits 24 h
	thr := r.ft.Add(faults.Rule{Op: "DynamoDB.Query", Fault: faults.Throttle, Times: 4,
		Match: func(b []byte) bool { return strings.Contains(string(b), id) }})
	_, cerr := r.h.Producer().Cancel(context.Background(), id, "", 0)
	r.e.Drain(t, r.h)
	r.e.Advance(t, time.Hour+time.Minute)
	r.e.Drain(t, r.h)
	a := r.kid(t, id, "a")
	child := r.e.Get(t, a)
	if thr.Fired() != 4 || child.State != ledger.Failed || !child.Cancelled || r.ran("child 0") != 0 {
		t.Fatalf("throttled %d (Cancel: %v); the child %s cancelled=%v ran %d times; want it cancelled before it ran", thr.Fired(), cerr, child.State, child.Cancelled, r.ran("child 0"))
	}
	if o := r.e.Get(t, id).Steps[ledger.ChildStep(a)]; !strings.Contains(o, `"cancelled":true`) {
		t.Fatalf("the child's end in the caller: %q", o)
	}
}
