// Package nexjobtest runs a team's jobs in its own Go tests against a real
// backend: the default emulator (moto, started by Main when nothing else is
// configured), LocalStack, or real AWS, chosen by the SDK's standard
// environment. Each test gets a fresh table and queues; the jobs run
// through the same Enqueue and Handle code as in Lambda, never an
// in-memory copy of AWS.
//
//	func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }
//
//	func TestReceipt(t *testing.T) {
//		e := nexjobtest.New(t, nil)
//		h := e.Handler(t, orders.Registry(), nil)
//		res, _ := e.Client.Enqueue(ctx, orders.Receipt{OrderID: "1"}, &enqueue.Opts{Delay: time.Hour})
//		e.Drain(t, h)                   // nothing due: the receipt waits, Scheduled
//		e.Advance(t, time.Hour)         // the kit's clock, not a sleep
//		e.Drain(t, h)                   // due now: it runs
//		e.RequireState(t, res.ID, ledger.Succeeded)
//	}
//
// # Time
//
// Each Env has its own clock (real time plus what Advance added), read by
// its Client and its Handlers, and caps SQS delays at a second
// (Options.MaxDelay): a job an hour ahead, or a retry ten minutes ahead,
// waits Scheduled with its message hopping each second, and Drain leaves
// it so. Advance (or RunNow for one job) moves the clock past it, and the
// next Drain runs it within seconds. FireRecurring fires a recurring
// job's schedule in a test, with no Scheduler, target or ARNs.
//
// # The emulator
//
// Main starts moto's server (pinned: MotoVersion) on a free 127.0.0.1
// port with DynamoDB served one request at a time (so conditional writes
// are atomic, as on AWS), exports AWS_ENDPOINT_URL, a region and dummy
// credentials for the tests, and stops it when they end. It runs moto
// from the Python named by NEXJOB_MOTO_PYTHON, else from a .cache/venv
// found in the working directory or above it (this repository's), else it
// installs moto into a virtualenv under the user's cache directory, once
// (python3 and PyPI needed). With AWS_ENDPOINT_URL or NEXJOB_REAL_AWS=1
// set, it starts nothing.
//
// # How it fails
//
// A test with no backend is skipped with the reason, except under CI=true,
// where it fails: a CI run that skipped every test must not look green.
// An emulator that cannot be installed or started makes Main print why
// and return 1 without running the tests. Helpers fail the test (t.Fatal)
// on AWS errors; waits fail after their timeout with the record as it
// was.
package nexjobtest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/provision"
	"github.com/nexjob/nexjob-aws/recurring"
	"github.com/nexjob/nexjob-aws/settings"
)

// Config loads the SDK configuration of the backend under test, or skips
// (fails under CI=true) when there is none.
func Config(t testing.TB) aws.Config {
	t.Helper()
	if os.Getenv("AWS_ENDPOINT_URL") == "" && os.Getenv("NEXJOB_REAL_AWS") != "1" {
		msg := "no AWS backend: call nexjobtest.Main from TestMain (starts the default emulator), or set AWS_ENDPOINT_URL / NEXJOB_REAL_AWS=1"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatalf("load AWS config: %v", err)
	}
	trackResends(&cfg)
	return cfg
}

// Options tune New. The zero value (or nil) takes every default.
type Options struct {
	// Queue tunes the job queue (visibility timeout, receives before the
	// DLQ); zero fields take provision's defaults.
	Queue provision.QueueSpec
	// Ledger passes options to the ledger (a clock, the key secret, the
	// index): the Client and Handler both use them. With no Ledger.Now the
	// Env's own clock is used, which Advance moves.
	Ledger ledger.Options
	// StepsOnRecord keeps the jobs' steps in their records, as a
	// deployment with no steps table does (and did before it). Defaults to
	// false: the kit makes a steps table ("<table>-steps") and sets
	// Ledger.StepsTable, as the construct does.
	StepsOnRecord bool
	// BlobBucket makes a blob bucket for the Env (Env.BlobBucket) and sets
	// Ledger.BlobBucket: step values over ledger.MaxStepValueBytes go to
	// S3, as with the construct's. Defaults to false: none.
	BlobBucket bool
	// MaxDelay caps one SQS delay of the Env's Client and Handler: a
	// later job's message hops every MaxDelay, each hop checking the
	// clock, so Advance makes it due within a hop. Defaults to
	// DefaultMaxDelay.
	MaxDelay time.Duration
	// Queues names named queues (enqueue.Opts.Queue) to create beside the
	// job queue, each with its DLQ, as the construct's NamedQueues do: the
	// Env's Client, Handlers and Setenv know them, and Drain feeds them
	// all. Defaults to none.
	Queues []string
}

// DefaultMaxDelay is the test kit's longest SQS delay: a job an hour
// ahead waits in hops of a second, not in one 15-minute delay.
const DefaultMaxDelay = time.Second

// DrainHorizon is how far ahead Drain moves the clock to a job Scheduled
// for a reason other than its retry (a deferral, a debounce window, a
// short sleep); a job due later is left Scheduled (Advance the clock,
// then Drain again). A retry's backoff is followed whatever its length.
const DrainHorizon = 30 * time.Second

// DrainSteps bounds one Drain: how many times it may move the clock to
// the next job due (a retry, a deferral). A job retried more often than
// this fails the test, naming what is pending.
const DrainSteps = 1000

// DrainLimit bounds one Drain in real time, whatever its progress: a
// safety net for a queue that never empties (each move of the clock is
// bounded by DrainSteps, not by it).
const DrainLimit = 10 * time.Minute

// clock is the Env's clock: real time plus what Advance added.
type clock struct{ off atomic.Int64 }

func (c *clock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// Env is one test's own table and queues, and a client for them.
type Env struct {
	Cfg      aws.Config
	DB       *dynamodb.Client
	SQS      *sqs.Client
	Table    string
	QueueURL string
	DLQURL   string
	// StepsTable is the steps table ("" with Options.StepsOnRecord).
	StepsTable string
	// BlobBucket is the blob bucket (Options.BlobBucket), "" without.
	BlobBucket string
	// Queues are the named queues' URLs by name (Options.Queues), and
	// QueueDLQs their DLQs'.
	Queues, QueueDLQs map[string]string
	// Client enqueues into this Env.
	Client   *enqueue.Client
	ledger   ledger.Options
	clock    *clock // nil when Options.Ledger.Now was given
	maxDelay time.Duration
}

var nameRE = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// New creates a table and queues named after the test, and removes them
// when it ends.
func New(t testing.TB, opts *Options) *Env {
	t.Helper()
	var o Options
	if opts != nil {
		o = *opts
	}
	cfg := Config(t)
	name := nameRE.ReplaceAllString(t.Name(), "-")
	if len(name) > 50 {
		name = name[:50]
	}
	name = fmt.Sprintf("nj-%s-%d", strings.Trim(name, "-"), time.Now().UnixNano()%1e9)
	e := &Env{Cfg: cfg, DB: dynamodb.NewFromConfig(cfg), SQS: sqs.NewFromConfig(cfg), Table: name, ledger: o.Ledger, maxDelay: o.MaxDelay}
	if e.maxDelay <= 0 {
		e.maxDelay = DefaultMaxDelay
	}
	if e.ledger.Now == nil {
		e.clock = &clock{}
		e.ledger.Now = e.clock.Now
	}
	ctx := context.Background()
	if err := provision.Table(ctx, e.DB, name); err != nil {
		t.Fatal(err)
	}
	if !o.StepsOnRecord && e.ledger.StepsTable == "" {
		e.ledger.StepsTable = name + "-steps"
		if err := provision.StepsTable(ctx, e.DB, e.ledger.StepsTable); err != nil {
			t.Fatal(err)
		}
	}
	e.StepsTable = e.ledger.StepsTable
	if o.BlobBucket && e.ledger.BlobBucket == "" {
		e.ledger.BlobBucket = fmt.Sprintf("nj-blobs-%d", time.Now().UnixNano())
		if err := provision.BlobBucket(ctx, provision.S3(cfg), e.ledger.BlobBucket); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { emptyBucket(provision.S3(cfg), e.ledger.BlobBucket) })
	}
	e.BlobBucket = e.ledger.BlobBucket
	spec := o.Queue
	spec.Name = name
	var err error
	if e.QueueURL, e.DLQURL, err = provision.Queues(ctx, e.SQS, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = e.DB.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
		if e.ledger.StepsTable != "" {
			_, _ = e.DB.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(e.ledger.StepsTable)})
		}
		for _, url := range append([]string{e.QueueURL, e.DLQURL}, append(slices.Collect(maps.Values(e.Queues)), slices.Collect(maps.Values(e.QueueDLQs))...)...) {
			_, _ = e.SQS.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
		}
	})
	for _, q := range o.Queues {
		if e.Queues == nil {
			e.Queues, e.QueueDLQs = map[string]string{}, map[string]string{}
		}
		spec.Name = name + "-" + q
		if e.Queues[q], e.QueueDLQs[q], err = provision.Queues(ctx, e.SQS, spec); err != nil {
			t.Fatal(err)
		}
	}
	if e.Client, err = enqueue.New(cfg, name, e.QueueURL, &enqueue.ClientOptions{Ledger: e.ledger, MaxDelay: e.maxDelay, Queues: e.Queues}); err != nil {
		t.Fatal(err)
	}
	return e
}

// Setenv sets the nexjob variables (see package settings) to this Env for
// the rest of the test, for code that reads its configuration with
// settings.Load: a team's producer, lambdamain.NewHandler.
func (e *Env) Setenv(t testing.TB) {
	t.Helper()
	for k, v := range map[string]string{settings.EnvTable: e.Table, settings.EnvQueueURL: e.QueueURL, settings.EnvDLQURL: e.DLQURL} {
		t.Setenv(k, v)
	}
	if len(e.Queues) > 0 {
		qs := map[string]settings.NamedQueue{}
		for name, url := range e.Queues {
			qs[name] = settings.NamedQueue{URL: url, DLQURL: e.QueueDLQs[name]}
		}
		b, err := json.Marshal(qs)
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv(settings.EnvQueues, string(b))
	}
}

// Handler returns the real handler for reg over this Env (opts nil: all
// defaults), with the Env's ledger options.
func (e *Env) Handler(t testing.TB, reg *handler.Registry, opts *handler.Options) *handler.Handler {
	t.Helper()
	var o handler.Options
	if opts != nil {
		o = *opts
	}
	o.Ledger = e.ledger
	if o.Backoff == nil {
		// No draw in a test's outcome: a retry comes after its backoff's
		// lower bound (16 s, 31 s, …), every run.
		o.Backoff = handler.FloorBackoff
	}
	if o.DLQURL == "" {
		o.DLQURL = e.DLQURL
	}
	if o.MaxDelay == 0 {
		o.MaxDelay = e.maxDelay
	}
	if o.Queues == nil {
		o.Queues = e.Queues
	}
	h, err := handler.New(e.Cfg, e.Table, e.QueueURL, reg, &o)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// Drain feeds the job queue (and the named queues) to h.Handle, as
// Lambda's event source mappings do, until nothing is left to run: no
// message visible or in flight, no retry Scheduled, and no job Scheduled
// within DrainHorizon of h's clock. It never waits for the clock: when all
// that is left is Scheduled, it moves the Env's clock to the first of them
// (Advance) and goes on: every retry whatever its backoff (the second,
// 31 s out, the tenth, hours out: the kit's handlers retry with
// handler.FloorBackoff, no jitter), and a throttle or concurrency
// deferral, a debounce window or a short sleep within DrainHorizon. So a
// job that fails twice and succeeds runs three times in one Drain, in
// well under a second. A job due later for another reason (a 1-hour
// delay, a long sleep, a wait) is left Scheduled: Advance past it and
// Drain again, or RunToEnd. With a clock of the test's own
// (Options.Ledger.Now) it cannot move the clock and waits for those jobs
// in real time. Drain fails the test, naming each job still pending (its
// state, run time, attempt and last error), after DrainSteps moves of the
// clock, when no message was handled for a minute while work remained (a
// stuck queue), or after DrainLimit in all. DrainNow runs only what is
// due now.
func (e *Env) Drain(t testing.TB, h *handler.Handler) {
	t.Helper()
	e.drain(t, h, DrainHorizon)
}

// DrainNow is one pass: it runs what is due now on h's clock and returns,
// moving no clock and waiting for nothing Scheduled later (a retry is left
// Scheduled, to assert on before the next Drain or Advance).
func (e *Env) DrainNow(t testing.TB, h *handler.Handler) {
	t.Helper()
	e.drain(t, h, 0)
}

func (e *Env) drain(t testing.TB, h *handler.Handler, horizon time.Duration) {
	t.Helper()
	var ps []*poller.Poller
	for _, url := range e.queueURLs() {
		ps = append(ps, poller.New(e.SQS, url, h.Handle, &poller.Options{WaitTime: -1}))
	}
	now := h.Producer().Store().Now
	own := e.clock != nil // Advance moves h's clock too, when h is the Env's (checked below)
	// Quiet twice in a row: SQS's counts are read one after another, so a
	// message that turns visible between them is in neither once.
	limit := time.Now().Add(DrainLimit)
	moves := 0
	for end, quiet := time.Now().Add(time.Minute), 0; time.Now().Before(end) && time.Now().Before(limit); {
		n := 0
		for _, p := range ps {
			got, err := p.Poll(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			n += got
		}
		if n > 0 {
			quiet, end = 0, time.Now().Add(time.Minute) // progress
			continue
		}
		next, waiting := e.nextScheduled(t, now(), horizon, own && horizon > 0)
		switch {
		case e.visible(t) > 0:
			quiet = 0 // in flight elsewhere, or just turned visible
		case !waiting:
			if quiet++; quiet == 2 {
				return
			}
			continue
		case own && next.After(now()):
			if moves++; moves > DrainSteps {
				t.Fatalf("Drain moved the clock %d times (DrainSteps) and jobs are still pending (a job retried for ever?); pending:\n%s", DrainSteps, e.Pending(t))
			}
			e.clock.off.Add(int64(next.Sub(now()))) // nothing else to run: its time, now
			if now().Before(next) {
				own = false // h reads a clock of its own: wait for it in real time
			}
			quiet = 0
			continue
		default:
			quiet = 0 // due, its message still in an SQS delay (at most MaxDelay); or a clock of the test's own
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("queue %s did not drain (no message handled for a minute, or %s in all; %d messages left); pending (Advance past a run time, or RunToEnd a job, to go on):\n%s", e.QueueURL, DrainLimit, e.QueueDepth(t, e.QueueURL), e.Pending(t))
}

// queueURLs are the job queue's URL and the named queues', in name order.
func (e *Env) queueURLs() []string {
	urls := []string{e.QueueURL}
	for _, name := range slices.Sorted(maps.Keys(e.Queues)) {
		urls = append(urls, e.Queues[name])
	}
	return urls
}

// visible counts the queues' messages visible or in flight (not the
// delayed ones: hops of jobs not yet due).
func (e *Env) visible(t testing.TB) int {
	t.Helper()
	n := 0
	for _, url := range e.queueURLs() {
		a, err := e.SQS.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
			QueueUrl: aws.String(url),
			AttributeNames: []sqstypes.QueueAttributeName{
				sqstypes.QueueAttributeNameApproximateNumberOfMessages,
				sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			},
		})
		if err != nil {
			t.Fatalf("queue attributes: %v", err)
		}
		for _, v := range a.Attributes {
			i, _ := strconv.Atoi(v)
			n += i
		}
	}
	return n
}

// nextScheduled is the earliest run time of a job Scheduled before
// now+horizon, or (retries) for its retry whatever its time (its
// message may be delayed: the queue's visible count misses it), and
// whether there is one; with horizon 0, of a job due now. Enqueued and
// running jobs have their message visible or in flight. One consistent
// Scan: a test's table is small.
func (e *Env) nextScheduled(t testing.TB, now time.Time, horizon time.Duration, retries bool) (time.Time, bool) {
	t.Helper()
	var next time.Time
	found := false
	for _, r := range e.Scan(t) {
		at := ledger.Millis(r.RunAt)
		if r.State != ledger.Scheduled || r.ID == "" || r.ExpiredAt(now) || at.After(now.Add(horizon)) && (!retries || !retrying(r)) {
			continue
		}
		if !found || at.Before(next) {
			next, found = at, true
		}
	}
	return next, found
}

// retrying reports whether r is Scheduled for a retry: its last run
// failed and set its run time (the history's last attempt is that
// failure, written with the record's last change). A sleep, a wait or a
// deferral writes no attempt; a delay never ran.
func retrying(r ledger.Record) bool {
	hist := r.Attempts() // newest first
	if len(hist) == 0 {
		return false
	}
	last := hist[0]
	return last.State == ledger.Scheduled && last.At == r.UpdatedAt
}

// Scan reads every item of the table, decoded, archived and expired ones
// included (one consistent Scan: a test's table is small).
func (e *Env) Scan(t testing.TB) []ledger.Record {
	t.Helper()
	var out []ledger.Record
	p := dynamodb.NewScanPaginator(e.DB, &dynamodb.ScanInput{TableName: aws.String(e.Table), ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatalf("scan %s: %v", e.Table, err)
		}
		var recs []ledger.Record
		if err := attributevalue.UnmarshalListOfMaps(page.Items, &recs); err != nil {
			t.Fatalf("decode: %v", err)
		}
		out = append(out, recs...)
	}
	return out
}

// Now is the Env's clock: what its Client and Handler read.
func (e *Env) Now() time.Time { return e.ledger.Now() }

// Advance moves the Env's clock forward by d, for its Client and its
// Handlers: a Scheduled job (a delay, a retry's backoff) whose time it
// passes runs at the next Drain, within a hop (MaxDelay). Advance between
// Drains, not while a job runs: a running job's lease is on this clock
// too. It fails the test when Options.Ledger.Now gave another clock.
func (e *Env) Advance(t testing.TB, d time.Duration) {
	t.Helper()
	if e.clock == nil {
		t.Fatal("nexjobtest: Advance needs the Env's own clock (Options.Ledger.Now was set)")
	}
	e.clock.off.Add(int64(d))
}

// RunNow advances the Env's clock to the job's run time, if it is
// Scheduled later: the next Drain runs it (and whatever else that time
// passes).
func (e *Env) RunNow(t testing.TB, id string) {
	t.Helper()
	rec := e.Get(t, id)
	if rec.State != ledger.Scheduled {
		return
	}
	if d := ledger.Millis(rec.RunAt).Sub(e.Now()); d > 0 {
		e.Advance(t, d)
	}
}

// FireRecurring does in a test what a recurring schedule's firing at at
// does on AWS: it enqueues the job (recurring.Fire, through the Env's
// Client) as the schedule id with args and opts would, with no
// Scheduler, no target function and no ARNs.
func (e *Env) FireRecurring(t testing.TB, id string, args enqueue.JobArgs, opts *recurring.Opts, at time.Time) enqueue.Result {
	t.Helper()
	f, err := recurring.NewFiring(id, args, opts)
	if err != nil {
		t.Fatal(err)
	}
	f.ScheduledTime = at.UTC().Format(time.RFC3339)
	res, err := recurring.Fire(context.Background(), e.Client, f)
	if err != nil {
		t.Fatalf("fire %s: %v", id, err)
	}
	return res
}

// emptyBucket deletes the bucket's objects and the bucket (best effort:
// a test's cleanup).
func emptyBucket(c *s3.Client, bucket string) {
	ctx := context.Background()
	p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return
		}
		for _, o := range page.Contents {
			_, _ = c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: o.Key})
		}
	}
	_, _ = c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)})
}
