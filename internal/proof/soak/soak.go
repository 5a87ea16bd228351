// Package soak runs nexjob under random faults everywhere at once and
// checks what must hold afterwards: a seeded chaos soak in the spirit of
// FoundationDB's simulation and Jepsen's nemeses, against the real SDK and
// a real backend (the default emulator in make test).
//
// Run starts producers, in-process workers (one with its clock a few
// seconds ahead), worker processes that it SIGKILLs and restarts at
// random, the DLQ consumer, the dispatch guard and an operator that
// cancels scheduled jobs, all against one table and its queues. Every AWS
// request of every one of them goes through a faults.Transport whose
// Nemesis, drawn from the seed, loses replies, times out and throttles
// through the SDK's whole retry budget; workers' receives deliver some
// messages twice. Then the faults and kills stop, the system is given
// until it is quiet, and Check reads the ledger, the queues and the run
// logs against the invariants.
//
// # Replaying a seed
//
// The seed fixes the job mix, every fault choice in the order requests
// come, and the kill times. The goroutine and process interleaving is the
// scheduler's, so a seed replays the same choices, not the same history;
// a failure prints the seed, the fault counts and the job's history.
package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Config is one soak run. Zero values take the defaults.
type Config struct {
	Seed      uint64
	Jobs      int     // enqueue calls the producers make (default 300)
	Calls     int     // idempotent calls (package idempotency) beside them (default Jobs/3)
	Producers int     // default 3
	Workers   int     // in-process workers (default 2; the first runs its clock Skew ahead)
	Children  int     // worker processes, killed and restarted (default 2)
	FaultRate float64 // share of AWS requests faulted (default 0.03)
	Skew      time.Duration
	KillEvery time.Duration // mean time between kills (default 1.5 s)
	Outage    time.Duration // every worker down at once, once (default 15 ms a job, 3 s to 1 min)
	Quiet     time.Duration // the longest wait for quiet with nothing moving, after the faults stop (default 3 min; five times it in all)
	Dir       string        // run logs (required)
	Logf      func(format string, args ...any)
}

func (c *Config) defaults() {
	if c.Jobs <= 0 {
		c.Jobs = 300
	}
	if c.Producers <= 0 {
		c.Producers = 3
	}
	if c.Calls <= 0 {
		c.Calls = max(c.Jobs/3, 20)
	}
	if c.Workers <= 0 {
		c.Workers = 2
	}
	if c.Children < 0 {
		c.Children = 0
	} else if c.Children == 0 {
		c.Children = 2
	}
	if c.FaultRate <= 0 {
		c.FaultRate = 0.03
	}
	if c.Skew == 0 {
		c.Skew = 2 * time.Second
	}
	if c.KillEvery <= 0 {
		c.KillEvery = 1500 * time.Millisecond
	}
	if c.Outage <= 0 {
		c.Outage = min(max(time.Duration(c.Jobs)*15*time.Millisecond, 3*time.Second), time.Minute)
	}
	if c.Quiet <= 0 {
		c.Quiet = 3 * time.Minute
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// Env is the table and queues under test.
type Env struct {
	Cfg      aws.Config
	Table    string
	QueueURL string
	DLQURL   string
	// StepsTable is the steps table every process's ledger uses (durable
	// jobs' steps off their records); "" keeps them on the records.
	StepsTable string
	// BlobBucket is the blob bucket every process's ledger uses (step
	// values over ledger.MaxStepValueBytes: an Invoker's big step); ""
	// none (the big step then fails its job for good).
	BlobBucket string
	// BulkURL and BulkDLQURL are the named queue "bulk" (enqueue.Opts.Queue)
	// and its DLQ: part of the mix goes there, and every worker polls it
	// too. Empty: the mix stays on the job queue.
	BulkURL, BulkDLQURL string
}

// queues are the named queues of env (enqueue.ClientOptions.Queues).
func (env Env) queues() map[string]string {
	if env.BulkURL == "" {
		return nil
	}
	return map[string]string{Bulk: env.BulkURL}
}

// jobQueues are the URLs of the queues every worker polls.
func (env Env) jobQueues() []string {
	if env.BulkURL == "" {
		return []string{env.QueueURL}
	}
	return []string{env.QueueURL, env.BulkURL}
}

// Bulk is the soak's named queue.
const Bulk = "bulk"

// Report is what a run did.
type Report struct {
	Seed       uint64
	Enqueues   int            // calls made (an EnqueueMany item counts as one)
	Jobs       int            // records at the end
	Requests   int            // AWS requests seen by the nemeses
	Faults     map[string]int // injected, by kind
	Kills      int
	Duplicated int // messages delivered twice on purpose
	Runs       int
	MaxRuns    int // of one job
	ToQuiet    time.Duration
	Violations []string
	// Flow counts the mix's flow-control calls: jobs on the named queue,
	// limited and throttled jobs, rate-limited enqueues refused.
	Flow map[string]int
	// Calls and CallRuns count the idempotent calls made and their
	// functions' runs.
	Calls, CallRuns int
}

// FaultShare is the share of requests faulted.
func (r Report) FaultShare() float64 {
	n := 0
	for k, v := range r.Faults {
		if k != "throttle burst" {
			n += v
		}
	}
	if r.Requests == 0 {
		return 0
	}
	return float64(n) / float64(r.Requests)
}

func (r Report) String() string {
	return fmt.Sprintf("soak seed=%d: %d enqueues, %d jobs, %d AWS requests, faults %v (%.1f %% of requests), %d worker kills, %d duplicate deliveries, %d runs (at most %d of one job), quiet after %s, flow control %v, %d idempotent calls (%d runs), %d violations",
		r.Seed, r.Enqueues, r.Jobs, r.Requests, r.Faults, 100*r.FaultShare(), r.Kills, r.Duplicated, r.Runs, r.MaxRuns, r.ToQuiet.Round(time.Millisecond), r.Flow, r.Calls, r.CallRuns, len(r.Violations))
}

// Run runs one soak and checks it.
func Run(ctx context.Context, env Env, c Config) (Report, error) {
	c.defaults()
	rep := Report{Seed: c.Seed, Faults: map[string]int{}}
	root := rand.New(rand.NewPCG(c.Seed, 1))
	var nemeses []*Nemesis
	nemesis := func() *Nemesis {
		n := NewNemesis(root.Uint64(), c.FaultRate)
		nemeses = append(nemeses, n)
		return n
	}
	runLog := func(name string) (*RunLog, error) { return OpenRunLog(filepath.Join(c.Dir, name+".runs")) }

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	var dups []*duplicating
	down := new(atomic.Bool) // the outage nemesis

	// In-process workers, the first with its clock ahead.
	for i := range c.Workers {
		l, err := runLog(fmt.Sprintf("worker-%d", i))
		if err != nil {
			return rep, err
		}
		defer func() { _ = l.Close() }()
		fc := faulty(env.Cfg, nemesis())
		wlog := logTo(filepath.Join(c.Dir, fmt.Sprintf("worker-%d.runs.log", i)))
		o := &handler.Options{Logger: wlog, Lease: 20 * time.Second, Queues: env.queues(), GuardAfter: 2 * time.Second}
		o.Ledger.StepsTable, o.Ledger.BlobBucket = env.StepsTable, env.BlobBucket
		switch i {
		case 0:
			o.Ledger.Now = func() time.Time { return time.Now().Add(c.Skew) }
		case 1: // a worker deployed with fewer index shards than the rest (listing)
			o.Ledger.IndexShards = fewerShards
		}
		h, err := handler.New(fc, env.Table, env.QueueURL, Registry(l), o)
		if err != nil {
			return rep, err
		}
		d := &duplicating{Client: sqs.NewFromConfig(fc), rng: rand.New(rand.NewPCG(root.Uint64(), 7)), down: down}
		dups = append(dups, d)
		for _, url := range env.jobQueues() {
			p := poller.New(d, url, h.Handle, &poller.Options{WaitTime: time.Second, FunctionTimeout: functionTimeout, Logger: wlog})
			wg.Go(func() { _ = p.Run(ctx) })
		}
		for _, url := range []string{env.DLQURL, env.BulkDLQURL} {
			if i == 0 && url != "" {
				dl := poller.New(sqs.NewFromConfig(fc), url, h.HandleDeadLetters, &poller.Options{WaitTime: time.Second, Logger: wlog})
				wg.Go(func() { _ = dl.Run(ctx) })
			}
		}
	}
	// The dispatch guard, on the table's stream.
	{
		fc := faulty(env.Cfg, nemesis())
		g := guard.New(sqs.NewFromConfig(fc), env.QueueURL, &guard.Options{After: 2 * time.Second, Logger: logTo(filepath.Join(c.Dir, "guard.log")), Queues: env.queues()})
		sp := guard.NewStreamPoller(dynamodb.NewFromConfig(env.Cfg), dynamodbstreams.NewFromConfig(env.Cfg), env.Table, g)
		wg.Go(func() { _ = sp.Run(ctx) })
	}

	// Worker processes, killed and restarted until the faults stop.
	kills := newKiller(c, env, root, &rep)
	killDone := make(chan struct{})
	go func() { defer close(killDone); kills.run(ctx) }()

	// Producers and the operator.
	led := &ledgerOf{results: map[string]*result{}}
	var prod sync.WaitGroup
	per := c.Jobs / c.Producers
	for i := range c.Producers {
		n := per
		if i == c.Producers-1 {
			n = c.Jobs - per*(c.Producers-1)
		}
		fc := faulty(env.Cfg, nemesis())
		co := &enqueue.ClientOptions{Logger: logTo(filepath.Join(c.Dir, fmt.Sprintf("producer-%d.log", i))), RedispatchAfter: 3 * time.Second, Queues: env.queues()}
		co.Ledger.StepsTable, co.Ledger.BlobBucket = env.StepsTable, env.BlobBucket
		switch i {
		case 1: // a producer whose clock runs ahead (rate limits under skew)
			co.Ledger.Now = func() time.Time { return time.Now().Add(producerSkew) }
		case 2: // a producer deployed with more index shards than the rest (listing)
			co.Ledger.IndexShards = moreShards
		}
		cl, err := enqueue.New(fc, env.Table, env.QueueURL, co)
		if err != nil {
			return rep, err
		}
		// As settings.Load does at start: a count above the default is
		// recorded before the first write (through no fault: a failure
		// here would stop the process, not the soak's point).
		if err := ledgerOn(env, co.Ledger).RecordIndexShards(ctx); err != nil {
			return rep, err
		}
		pr := &producer{c: cl, db: dynamodb.NewFromConfig(fc), rng: rand.New(rand.NewPCG(root.Uint64(), 3)), led: led, keys: max(8, c.Jobs/5), id: i, bulk: env.BulkURL != ""}
		prod.Go(func() { pr.run(ctx, n) })
	}
	// Idempotent calls from two processes, beside the producers.
	calls := &callLog{}
	var callers [2]*idempotency.Store
	for i := range callers {
		o := &idempotency.Options{Function: "soak", Hold: 10 * time.Second, Logger: logTo(filepath.Join(c.Dir, fmt.Sprintf("calls-%d.log", i)))}
		if i == 1 {
			o.Ledger.Now = func() time.Time { return time.Now().Add(callSkew) }
			o.Wait = true
		}
		st, err := idempotency.New(faulty(env.Cfg, nemesis()), env.Table, o)
		if err != nil {
			return rep, err
		}
		callers[i] = st
	}
	callRng := rand.New(rand.NewPCG(root.Uint64(), 13))
	prod.Go(func() { runCalls(ctx, callers, c.Calls, max(4, c.Calls/4), callRng, calls) })
	opLog := logTo(filepath.Join(c.Dir, "operator.log"))
	op, err := enqueue.New(faulty(env.Cfg, nemesis()), env.Table, env.QueueURL, &enqueue.ClientOptions{Logger: opLog, Queues: env.queues(), Ledger: ledger.Options{StepsTable: env.StepsTable, BlobBucket: env.BlobBucket}})
	if err != nil {
		return rep, err
	}
	fireClient, err := enqueue.New(faulty(env.Cfg, nemesis()), env.Table, env.QueueURL, &enqueue.ClientOptions{Logger: logTo(filepath.Join(c.Dir, "firings.log")), RedispatchAfter: 3 * time.Second, Queues: env.queues()})
	if err != nil {
		return rep, err
	}
	opDone := make(chan struct{})
	opCtx, opStop := context.WithCancel(ctx)
	go func() { defer close(opDone); operate(opCtx, op, opLog, led, rand.New(rand.NewPCG(root.Uint64(), 5))) }()
	fireDone := make(chan struct{})
	go func() { defer close(fireDone); fire(opCtx, fireClient, led, rand.New(rand.NewPCG(root.Uint64(), 11))) }()
	outageDone := make(chan struct{})
	go func() {
		defer close(outageDone)
		// All workers down at once, a third of the way through the mix:
		// deferred and scheduled jobs pile up and come back together.
		for led.calls() < c.Jobs/3 && opCtx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
		}
		if opCtx.Err() != nil {
			return
		}
		c.Logf("soak seed=%d: outage: every worker down for %s", c.Seed, c.Outage)
		down.Store(true)
		kills.outage(ctx, c.Outage)
		down.Store(false)
	}()
	prod.Wait()
	<-outageDone
	opStop()
	<-opDone
	<-fireDone
	c.Logf("soak seed=%d: producers done (%d enqueues); stopping the faults and the kills", c.Seed, led.calls())

	// The quiet period: no faults, no kills, until every record has ended.
	for _, n := range nemeses {
		n.Off()
	}
	kills.stop()
	<-killDone
	start := time.Now()
	checkClient, err := enqueue.New(env.Cfg, env.Table, env.QueueURL, &enqueue.ClientOptions{Logger: quietLog(), Queues: env.queues(), Ledger: ledger.Options{StepsTable: env.StepsTable, BlobBucket: env.BlobBucket}})
	if err != nil {
		return rep, err
	}
	st := checkClient.Store()
	if err := waitQuiet(ctx, env, st, c.Quiet, quietMost(c)); err != nil {
		rep.Violations = append(rep.Violations, err.Error())
	}
	rep.ToQuiet = time.Since(start)
	stop()
	wg.Wait()
	kills.wait()

	for _, n := range nemeses {
		counts, seen := n.Counts()
		rep.Requests += seen
		for k, v := range counts {
			rep.Faults[k] += v
		}
	}
	for _, d := range dups {
		rep.Duplicated += int(d.copies.Load())
	}
	rep.Duplicated += kills.copies()
	rep.Enqueues = led.calls()
	rep.Flow = led.flow()
	runs, err := readRuns(c.Dir)
	if err != nil {
		return rep, err
	}
	rep.Calls, rep.CallRuns = len(calls.calls), len(calls.runs)
	rep.Violations = append(rep.Violations, check(context.Background(), env, checkClient, led, runs, kills.killed(), calls, &rep, c)...)
	return rep, nil
}

func depth(ctx context.Context, q *sqs.Client, url string) int {
	if url == "" {
		return 0
	}
	out, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"}})
	if err != nil {
		return 1
	}
	n := 0
	for _, v := range out.Attributes {
		x, _ := strconv.Atoi(v)
		n += x
	}
	return n
}
