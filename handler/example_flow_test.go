package handler_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/provision"
)

// Report is a tenant's report; at most one per tenant runs at a time,
// and at most two start per second.
type Report struct {
	Tenant string `json:"tenant"`
	Month  string `json:"month"`
}

func (Report) Kind() string { return "report" }

// exampleRun provisions a table and queue on the SDK environment's
// backend (make test starts the default emulator), enqueues jobs and runs
// the handler over reg until they are done (and, if set, until done
// says so: jobs they enqueued ran too).
func exampleRun(name string, reg *handler.Registry, jobs []enqueue.JobArgs, done ...func() bool) {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		panic(err)
	}
	name = fmt.Sprintf("example-%s-%d", name, time.Now().UnixNano())
	if err := provision.Table(ctx, dynamodb.NewFromConfig(cfg), name); err != nil {
		panic(err)
	}
	q := sqs.NewFromConfig(cfg)
	queueURL, _, err := provision.Queues(ctx, q, provision.QueueSpec{Name: name})
	if err != nil {
		panic(err)
	}
	h, err := handler.New(cfg, name, queueURL, reg, &handler.Options{Logger: quiet})
	if err != nil {
		panic(err)
	}
	var ids []string
	for _, j := range jobs {
		res, err := h.Producer().Enqueue(ctx, j, nil)
		if err != nil {
			panic(err)
		}
		ids = append(ids, res.ID)
	}
	p := poller.New(q, queueURL, h.Handle, &poller.Options{WaitTime: time.Second, Logger: quiet})
	for _, id := range ids {
		for {
			rec, err := h.Producer().Store().Get(ctx, id)
			if err != nil {
				panic(err)
			}
			if rec.State.Terminal() {
				break
			}
			if _, err := p.Poll(ctx); err != nil {
				panic(err)
			}
		}
	}
	for _, d := range done {
		for !d() {
			if _, err := p.Poll(ctx); err != nil {
				panic(err)
			}
		}
	}
}

// Throttle: at most two report runs start per second for one tenant;
// the others wait for their slots, none dropped, no attempt spent.
func ExampleThrottle() {
	var mu sync.Mutex
	var starts []time.Time
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[Report](func(ctx context.Context, j *handler.Job[Report]) error {
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, time.Now())
		return nil
	}), &handler.KindOptions{Throttle: &handler.Throttle{
		Key:   handler.ArgsKey(func(r Report) string { return r.Tenant }),
		Limit: 2, Period: time.Second,
	}})
	exampleRun("throttle", reg, []enqueue.JobArgs{Report{"acme", "01"}, Report{"acme", "02"}, Report{"acme", "03"}, Report{"acme", "04"}})
	slices.SortFunc(starts, time.Time.Compare)
	fmt.Println("runs:", len(starts))
	fmt.Println("the 3rd and 4th waited a period:", starts[3].Sub(starts[0]) >= time.Second-100*time.Millisecond)
	// Output:
	// runs: 4
	// the 3rd and 4th waited a period: true
}

// Concurrency: one report at a time per tenant; a job that finds its
// tenant's slot taken goes back to the queue and comes again.
func ExampleConcurrency() {
	var mu sync.Mutex
	running, most := 0, 0
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[Report](func(ctx context.Context, j *handler.Job[Report]) error {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		running--
		mu.Unlock()
		return nil
	}), &handler.KindOptions{Concurrency: &handler.Concurrency{
		Key:   handler.ArgsKey(func(r Report) string { return r.Tenant }),
		Limit: 1, MaxBackoff: time.Second,
	}})
	exampleRun("concurrency", reg, []enqueue.JobArgs{Report{"acme", "01"}, Report{"acme", "02"}, Report{"acme", "03"}})
	fmt.Println("most at once:", most)
	// Output:
	// most at once: 1
}

// Checkout is a job whose work runs in three branches at once.
type Checkout struct{ Order string }

func (Checkout) Kind() string { return "example.checkout" }

// Parallel: three branches of their own at once, results in the
// branches' order; a retry would replay the branches that finished and
// run only the rest.
func ExampleParallel() {
	var mu sync.Mutex
	var got []string
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[Checkout](func(ctx context.Context, j *handler.Job[Checkout]) error {
		branch := func(what string) func(context.Context) (string, error) {
			return func(context.Context) (string, error) { return what + " " + j.Args.Order, nil }
		}
		res, err := handler.Parallel(ctx, "checkout", []func(context.Context) (string, error){
			branch("charged"), branch("emailed"), branch("reserved"),
		}, nil)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		got = res.Values
		return nil
	}), nil)
	exampleRun("parallel", reg, []enqueue.JobArgs{Checkout{"A-1"}})
	fmt.Println(strings.Join(got, ", "))
	// Output:
	// charged A-1, emailed A-1, reserved A-1
}
