package lambdamain_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/lambdamain"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/recurring"
	"github.com/nexjob/nexjob-aws/settings"
)

type note struct{ Text string }

func (note) Kind() string { return "note" }

func registry() *handler.Registry {
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[note](func(context.Context, *handler.Job[note]) error { return nil }), nil)
	return reg
}

func TestMain(m *testing.M) {
	if os.Getenv("LAMBDAMAIN_TEST_SERVE") == "1" { // a main with a bad configuration
		lambdamain.Serve(registry(), nil)
		return
	}
	os.Exit(nexjobtest.Main(m))
}

type sqsHandler = func(context.Context, events.SQSEvent) (events.SQSEventResponse, error)

// started runs Serve with the environment as set and returns the handler
// it would give lambda.Start.
func started(t *testing.T) sqsHandler {
	t.Helper()
	var got any
	lambdamain.Serve(registry(), &lambdamain.Options{Start: func(h any) { got = h }})
	fn, ok := got.(sqsHandler)
	if !ok {
		t.Fatalf("started %T, want an SQS handler", got)
	}
	return fn
}

// TestServeWorker: the role, the table, the queue and the retention come
// from the environment the construct sets; the worker runs the job.
func TestServeWorker(t *testing.T) {
	e := nexjobtest.New(t, nil)
	e.Setenv(t)
	t.Setenv(settings.EnvRole, string(settings.Worker))
	t.Setenv(settings.EnvRetention, "succeeded=1h")
	fn := started(t)
	res, err := e.Client.Enqueue(context.Background(), note{Text: "hi"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := fn(context.Background(), poller.Event(e.QueueURL, e.Messages(t, e.QueueURL)))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("%+v %v", resp, err)
	}
	rec := e.RequireState(t, res.ID, ledger.Succeeded)
	if left := time.Until(time.Unix(rec.ExpiresAt, 0)); left < 59*time.Minute || left > 61*time.Minute {
		t.Fatalf("retention %s; NEXJOB_RETENTION did not reach the handler", left)
	}
}

// TestServeDeadLetter: NEXJOB_ROLE=deadletter starts the DLQ consumer.
func TestServeDeadLetter(t *testing.T) {
	e := nexjobtest.New(t, nil)
	e.Setenv(t)
	t.Setenv(settings.EnvRole, string(settings.DeadLetter))
	fn := started(t)
	ev := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m-1", Body: "not a job", Attributes: map[string]string{"ApproximateReceiveCount": "5"}}}}
	if resp, err := fn(context.Background(), ev); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("%+v %v", resp, err)
	}
	recs, _, err := e.Client.Store().List(context.Background(), ledger.Failed, 10, "")
	if err != nil || len(recs) != 1 || recs[0].Kind != handler.DeadLetterKind {
		t.Fatalf("dead letter not kept: %+v %v", recs, err)
	}
}

// TestBadConfigurationStopsAtStart: a main missing a variable exits 1 at
// start with one log line naming it.
func TestBadConfigurationStopsAtStart(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LAMBDAMAIN_TEST_SERVE=1", settings.EnvRole+"=worker", settings.EnvTable+"=", settings.EnvQueueURL+"=https://sqs/q")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "NEXJOB_TABLE must be set") || strings.Count(string(out), "\n") != 1 {
		t.Fatalf("log: %s", out)
	}
}

// TestServeDashboard: NEXJOB_ROLE=dashboard serves the dashboard to
// Lambda function URL requests, read-only unless NEXJOB_DASHBOARD_WRITE.
func TestServeDashboard(t *testing.T) {
	e := nexjobtest.New(t, nil)
	e.Setenv(t)
	t.Setenv(settings.EnvRole, string(settings.Dashboard))
	var got any
	lambdamain.Serve(registry(), &lambdamain.Options{Start: func(h any) { got = h }})
	fn, ok := got.(func(context.Context, *events.LambdaFunctionURLRequest) (*events.LambdaFunctionURLStreamingResponse, error))
	if !ok {
		t.Fatalf("started %T, want a function URL handler", got)
	}
	res, err := e.Client.Enqueue(context.Background(), note{Text: "hi"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	get := func(domain string) (int, string) {
		req := &events.LambdaFunctionURLRequest{RawPath: "/jobs/" + res.ID}
		req.RequestContext.DomainName = domain
		req.RequestContext.HTTP.Method = "GET"
		resp, err := fn(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// The function URL's own domain, in the function's region.
	code, body := get("abc.lambda-url." + e.Cfg.Region + ".on.aws")
	if code != 200 || !strings.Contains(body, "Job "+res.ID) || !strings.Contains(body, "read-only") {
		t.Fatalf("%d\n%s", code, body)
	}
	if code, _ := get("jobs.attacker.example"); code != 421 {
		t.Fatalf("another Host: %d, want 421", code)
	}
}

// TestServeRecurring: NEXJOB_ROLE=recurring starts the Scheduler target;
// a firing enqueues its job once per recurring id while it is active.
func TestServeRecurring(t *testing.T) {
	e := nexjobtest.New(t, nil)
	e.Setenv(t)
	t.Setenv(settings.EnvRole, string(settings.Recurring))
	var got any
	lambdamain.Serve(registry(), &lambdamain.Options{Start: func(h any) { got = h }})
	fn, ok := got.(func(context.Context, recurring.Firing) (enqueue.Result, error))
	if !ok {
		t.Fatalf("started %T, want a firing handler", got)
	}
	f := recurring.Firing{V: 1, ID: "digest", Kind: "note", Args: []byte(`{"text":"daily"}`), Concurrency: recurring.SkipIfRunning, ScheduledTime: "2026-12-03T08:00:00Z"}
	first, err := fn(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	f.ScheduledTime = "2026-12-04T08:00:00Z"
	second, err := fn(context.Background(), f)
	if err != nil || !second.Duplicate || second.ID != first.ID {
		t.Fatalf("second firing while the first is active: %+v %v", second, err)
	}
	e.RequireEnqueued(t, "note", recurring.KeyPrefix+"digest")
}

// TestLocal: one call runs a team's registry against the queues in the
// environment: a job enqueued while it runs Succeeds, a dead letter is
// recorded by the DLQ consumer beside it, and it returns when its context
// ends.
func TestLocal(t *testing.T) {
	e := nexjobtest.New(t, nil)
	e.Setenv(t)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- lambdamain.Local(ctx, registry(), &lambdamain.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	res, err := e.Client.Enqueue(context.Background(), note{Text: "local"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.WaitFor(t, res.ID, ledger.Succeeded, time.Minute)
	if _, err := e.SQS.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(e.DLQURL), MessageBody: aws.String("not a job")}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(time.Minute); e.QueueDepth(t, e.DLQURL) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the DLQ consumer did not take the dead letter")
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestLocalBadConfiguration: a missing variable is an error at once.
func TestLocalBadConfiguration(t *testing.T) {
	t.Setenv(settings.EnvTable, "")
	t.Setenv(settings.EnvQueueURL, "")
	var missing *settings.MissingError
	if err := lambdamain.Local(context.Background(), registry(), nil); !errors.As(err, &missing) {
		t.Fatalf("Local with no settings: %v", err)
	}
}

// TestOneLogFormat: after a role starts, slog.Default() (what a hook or a
// worker's own code logs with) writes through the library's logger: one
// format, with the function's role, in the log stream.
func TestOneLogFormat(t *testing.T) {
	e := nexjobtest.New(t, nil)
	e.Setenv(t)
	t.Setenv(settings.EnvRole, string(settings.Worker))
	before := slog.Default()
	t.Cleanup(func() { slog.SetDefault(before) })
	var buf bytes.Buffer
	lib := slog.New(slog.NewJSONHandler(&buf, nil)).With("function", "worker")
	lambdamain.Serve(registry(), &lambdamain.Options{Logger: lib, Start: func(any) {}})
	slog.Default().Info("hook says hi")
	if !strings.Contains(buf.String(), `"msg":"hook says hi","function":"worker"`) {
		t.Fatalf("slog.Default() did not write through the library's logger: %q", buf.String())
	}
}

// TestNoFunctionLinksTheSSMClient: every function reads the key secret
// with internal/ssmparam, so none links the SSM client package, whose
// schema registry made 0.9 MB of each binary and 1.7 ms of each cold
// start for one call.
func TestNoFunctionLinksTheSSMClient(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "../lambda/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/nexjob/nexjob-aws/internal/ssmparam") {
		t.Fatal("the functions do not read the key secret through ssmparam: the list is not what this test thinks")
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/aws/aws-sdk-go-v2/service/ssm") {
			t.Errorf("a function links %s", d)
		}
	}
}

// TestLocalRunsNamedQueues: Local polls every named queue NEXJOB_QUEUES
// names, and its DLQ, beside the job queue (before: 20 jobs on bulk stayed
// Enqueued with no warning); a named queue it cannot reach is an error at
// start, not jobs left waiting.
func TestLocalRunsNamedQueues(t *testing.T) {
	e := nexjobtest.New(t, &nexjobtest.Options{Queues: []string{"bulk"}})
	e.Setenv(t)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- lambdamain.Local(ctx, registry(), &lambdamain.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	var ids []string
	for i := range 5 {
		res, err := e.Client.Enqueue(context.Background(), note{Text: fmt.Sprint("bulk ", i)}, &enqueue.Opts{Queue: "bulk"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	for _, id := range ids {
		e.WaitFor(t, id, ledger.Succeeded, time.Minute)
	}
	if _, err := e.SQS.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(e.QueueDLQs["bulk"]), MessageBody: aws.String("not a job")}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(time.Minute); e.QueueDepth(t, e.QueueDLQs["bulk"]) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the bulk DLQ's dead letter was not taken")
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	t.Setenv(settings.EnvQueues, `{"gone":{"url":"`+e.QueueURL+`-gone"}}`)
	err := lambdamain.Local(context.Background(), registry(), &lambdamain.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), "cannot be reached") {
		t.Fatalf("Local with a queue that does not exist: %v, want an error at start", err)
	}
}

// TestLocalFiresRecurring: with NEXJOB_SCHEDULE_GROUP set (nexjob
// provision NAME --recurring prints it), Local fires the group's
// recurring schedules in-process by their cron, through recurring.Fire
// (the same one-firing-one-run keys): an hourly schedule's job runs once
// the clock passes the hour (before: nothing fired locally). A group that
// does not exist is named in Recurring's error (before: "StatusCode: 500
// … invalid character '<'").
func TestLocalFiresRecurring(t *testing.T) {
	e := nexjobtest.New(t, nil)
	e.Setenv(t)
	ctx := context.Background()
	group := e.Table + "-recurring"
	if _, err := scheduler.NewFromConfig(e.Cfg).CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(group)}); err != nil {
		t.Fatal(err)
	}
	opts := recurring.Options{Group: group, TargetARN: "arn:aws:lambda:us-east-1:000000000000:function:local", RoleARN: "arn:aws:iam::000000000000:role/local"}
	t.Setenv(settings.EnvScheduleGroup, group)
	t.Setenv(settings.EnvScheduleTarget, opts.TargetARN)
	t.Setenv(settings.EnvSchedulerRole, opts.RoleARN)
	if err := recurring.New(e.Cfg, opts).Recurring(ctx, "digest", "cron(0 * * * ? *)", note{Text: "hourly"}, nil); err != nil {
		t.Fatal(err)
	}
	missing := opts
	missing.Group = group + "-gone"
	if err := recurring.New(e.Cfg, missing).Recurring(ctx, "digest", "cron(0 * * * ? *)", note{Text: "hourly"}, nil); err == nil || !strings.Contains(err.Error(), `schedule group "`+missing.Group+`" does not exist`) {
		t.Fatalf("a schedule in a group that does not exist: %v, want the group named", err)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- lambdamain.Local(runCtx, registry(), &lambdamain.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Handler: &handler.Options{Ledger: ledger.Options{Now: e.Now}}})
	}()
	var rec ledger.Record
	for end := time.Now().Add(time.Minute); rec.State != ledger.Succeeded; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the hourly schedule never ran its job: %+v", rec)
		}
		e.Advance(t, time.Hour) // past the next hour, whenever the firer started
		var err error
		if rec, err = e.Client.Store().GetByKey(ctx, recurring.KeyPrefix+"digest"); err != nil && !errors.Is(err, ledger.ErrNotFound) {
			t.Fatal(err)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rec.RequestAt == 0 || time.UnixMilli(rec.RequestAt).UTC().Minute() != 0 {
		t.Fatalf("the job was made by a firing at %s; want an hour's firing", time.UnixMilli(rec.RequestAt).UTC())
	}
}
