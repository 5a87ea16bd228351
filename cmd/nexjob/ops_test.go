package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/recurring"
	"github.com/nexjob/nexjob-aws/settings"
)

// report is the operator tests' job: it fails while its kind is broken.
type report struct {
	Name string `json:"name"`
}

func (report) Kind() string { return "report" }

// rig is a deployment with a worker whose jobs fail while broken is set.
type rig struct {
	e      *awstest.Env
	h      *handler.Handler
	broken *atomic.Bool
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{e: awstest.New(t, nil), broken: new(atomic.Bool)}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[report](func(ctx context.Context, j *handler.Job[report]) error {
		if r.broken.Load() {
			return handler.Permanent(errors.New("report store unavailable"))
		}
		return nil
	}), nil)
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	return r
}

// cli runs the command line in process against the rig's deployment.
func (r *rig) cli(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return runCLI(r.e, args...)
}

// runCLI runs the command line in process against e's deployment (its
// table, steps table and queues).
func runCLI(e *awstest.Env, args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	env := map[string]string{settings.EnvTable: e.Table, settings.EnvStepsTable: e.StepsTable, settings.EnvQueueURL: e.QueueURL, settings.EnvDLQURL: e.DLQURL}
	c := &cli{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }}
	err = c.run(context.Background(), args)
	return out.String(), errOut.String(), err
}

func (r *rig) must(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := r.cli(t, args...)
	if err != nil {
		t.Fatalf("nexjob %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out + errOut
}

// enqueue adds n report jobs and returns their ids.
func (r *rig) enqueue(t *testing.T, n int, prefix string) []string {
	t.Helper()
	var ids []string
	for i := range n {
		res, err := r.e.Client.Enqueue(context.Background(), report{Name: fmt.Sprintf("%s-%d", prefix, i)}, &enqueue.Opts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	return ids
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"help", "--help", "-h"} {
		var out bytes.Buffer
		c := &cli{stdout: &out, stderr: &out, getenv: func(string) string { return "" }}
		if err := c.run(context.Background(), []string{arg}); err != nil {
			t.Fatalf("%s: %v", arg, err)
		}
		for _, w := range []string{"usage: nexjob COMMAND", "requeue --state S", "dashboard [--addr 127.0.0.1:8080] [--write]", "redrive", "move-queue NAME [--to OTHER]"} {
			if !strings.Contains(out.String(), w) {
				t.Fatalf("%s output lacks %q:\n%s", arg, w, out.String())
			}
		}
	}
}

// TestOperatorCommands (issue 11, item 4): list, get, stats, cancel,
// requeue of many with a progress bar, against jobs a real worker ran.
func TestOperatorCommands(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.broken.Store(true)
	failed := r.enqueue(t, 3, "broken")
	r.e.Drain(t, r.h)
	for _, id := range failed {
		r.e.RequireState(t, id, ledger.Failed)
	}
	r.broken.Store(false)
	waiting := r.enqueue(t, 2, "waiting") // not drained: Enqueued

	// list: a header, human times, the kind filter; flags after arguments.
	out := r.must(t, "list", "--state", "Failed", "--kind", "report", "--since", "1h")
	if !strings.HasPrefix(out, "JOB ") || !strings.Contains(out, "LAST ERROR") {
		t.Fatalf("list has no header:\n%s", out)
	}
	for _, id := range failed {
		if !strings.Contains(out, id) {
			t.Fatalf("list lacks %s:\n%s", id, out)
		}
	}
	if !strings.Contains(out, "report store unavailable") || !strings.Contains(out, "ago") && !strings.Contains(out, "just now") {
		t.Fatalf("list lacks the error or a human time:\n%s", out)
	}
	if out := r.must(t, "list", "--state", "Failed", "--kind", "other"); strings.Contains(out, failed[0]) {
		t.Fatalf("the kind filter let a report job through:\n%s", out)
	}
	if out := r.must(t, "list", "--state", "Failed", "--until", "1h"); strings.Contains(out, failed[0]) {
		t.Fatalf("--until 1h listed a job that failed just now:\n%s", out)
	}
	if out := r.must(t, "list", "--state=Failed", "--limit", "2"); strings.Count(out, "  report  ") != 2 {
		t.Fatalf("--limit 2 printed:\n%s", out)
	}
	// Enqueued is not indexed by default: listed by a scan, and said so.
	if out := r.must(t, "list", "--state", "Enqueued"); !strings.Contains(out, waiting[0]) || !strings.Contains(out, "scanning the table") {
		t.Fatalf("list of Enqueued jobs:\n%s", out)
	}

	// get: args only on request, with the flag after the id.
	if out := r.must(t, "get", failed[0]); strings.Contains(out, "broken-0") || !strings.Contains(out, "--show-args prints them") {
		t.Fatalf("get showed the args without --show-args:\n%s", out)
	}
	// get shows the runs the record keeps.
	if out := r.must(t, "get", failed[0]); !regexpLine(out, `run 1\s+failed: report store unavailable \((just now|\d+s ago)\)`) {
		t.Fatalf("get does not show the run's end:\n%s", out)
	}
	if out := r.must(t, "get", failed[0], "--show-args"); !strings.Contains(out, `{"name":"broken-0"}`) {
		t.Fatalf("get --show-args:\n%s", out)
	}

	// stats: counts per state and kind.
	out = r.must(t, "stats")
	if !regexpLine(out, `report\s+2\s+0\s+0\s+0\s+0\s+3\s+0`) || !strings.Contains(out, "job queue: 2 waiting") || !strings.Contains(out, "dead-letter queue: 0 messages") {
		t.Fatalf("stats:\n%s", out)
	}

	// cancel: the record is kept, Failed and marked; a second cancel is refused.
	r.must(t, "cancel", waiting[0], "--reason", "customer withdrew the order")
	rec := r.e.RequireState(t, waiting[0], ledger.Failed)
	if !rec.Cancelled || rec.LastError != "customer withdrew the order" || rec.ExpiresAt == 0 {
		t.Fatalf("cancelled record %+v", rec)
	}
	_, _, err := r.cli(t, "cancel", waiting[0])
	var nc *enqueue.NotCancellableError
	if !errors.As(err, &nc) || nc.State != ledger.Failed {
		t.Fatalf("second cancel: %v", err)
	}

	// requeue many, with a progress bar; then the worker runs them.
	out = r.must(t, "requeue", "--state", "Failed", "--kind", "report")
	if !strings.Contains(out, "requeue [##############################] 4/4") || !strings.Contains(out, "requeued 4 of 4 Failed jobs") {
		t.Fatalf("requeue of many:\n%s", out)
	}
	r.e.Drain(t, r.h)
	for _, id := range append(failed, waiting...) {
		r.e.RequireState(t, id, ledger.Succeeded)
	}

	// Bad input is a usage error naming the flag.
	for _, args := range [][]string{{"list", "--state", "Finished"}, {"list", "--since", "yesterday"}, {"get"}, {"frobnicate"}} {
		if _, _, err := r.cli(t, args...); err == nil || !strings.Contains(err.Error(), "nexjob help") {
			t.Fatalf("nexjob %v: %v", args, err)
		}
	}
}

// TestRedrive: a message in the DLQ whose job the DLQ consumer recorded
// Failed is requeued and runs; one that is not a job stays, reported.
func TestRedrive(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ids := r.enqueue(t, 1, "lost")
	rec, err := r.e.Client.Store().Get(context.Background(), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	// The job's message went to the DLQ and the consumer recorded it Failed.
	ctx := context.Background()
	r.e.Purge(t, r.e.QueueURL)
	if _, _, err := r.e.Client.Store().DeadLetter(ctx, rec, "poison message", time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{enqueue.Message{V: 1, ID: ids[0], Kind: "report"}.Encode(), "not a job"} {
		if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.DLQURL), MessageBody: aws.String(body)}); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, err := r.cli(t, "redrive")
	if err == nil || !strings.Contains(err.Error(), "not a job message, left in the DLQ") || !strings.Contains(out, "redrove 1 of 2 dead-letter messages") {
		t.Fatalf("redrive: %v\n%s%s", err, out, errOut)
	}
	r.e.Drain(t, r.h)
	r.e.RequireState(t, ids[0], ledger.Succeeded)
	if n := r.e.QueueDepth(t, r.e.DLQURL); n != 1 {
		t.Fatalf("DLQ holds %d messages after the redrive, want the 1 that is not a job", n)
	}
}

// TestErrorsPrintedOnce: the binary prints one "nexjob:" per failure line.
func TestErrorsPrintedOnce(t *testing.T) {
	r := newRig(t)
	ids := r.enqueue(t, 1, "x")
	bin := buildCLI(t)
	cmd := exec.Command(bin, "requeue", ids[0], "--table", r.e.Table, "--queue", r.e.QueueURL)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("requeue of an Enqueued job succeeded:\n%s", out)
	}
	want := "nexjob: job " + ids[0] + " is Enqueued; only terminal jobs can be requeued\n"
	if string(out) != want {
		t.Fatalf("printed %q, want %q", out, want)
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// regexpLine reports whether some line of out matches re.
func regexpLine(out, re string) bool {
	return regexp.MustCompile(`(?m)^` + re + `\s*$`).MatchString(out)
}

// TestRedriveSaysWhatItCouldNotSee: with the DLQ's messages in flight
// (received by a consumer or an old peek), redrive printed "redrove 0 of
// 0" and exited 0 while stats counted them. It must say they are there.
func TestRedriveSaysWhatItCouldNotSee(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.DLQURL), MessageBody: aws.String("held elsewhere")}); err != nil {
		t.Fatal(err)
	}
	got, err := r.e.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(r.e.DLQURL), VisibilityTimeout: 600, WaitTimeSeconds: 1})
	if err != nil || len(got.Messages) != 1 {
		t.Fatalf("hide the DLQ message: %v %d", err, len(got.Messages))
	}
	out, errOut, err := r.cli(t, "redrive")
	if err == nil || !strings.Contains(err.Error(), "the DLQ still holds 1 messages this redrive could not see") {
		t.Fatalf("redrive of a DLQ whose message is in flight: err %v\n%s%s", err, out, errOut)
	}
}

// TestRedriveSkipsSucceeded: a stray DLQ copy of a job that already
// Succeeded is deleted, reported as skipped, and not run again (redrive
// requeued every ended job, so it ran again).
func TestRedriveSkipsSucceeded(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ids := r.enqueue(t, 1, "done")
	r.e.Drain(t, r.h)
	before := r.e.RequireState(t, ids[0], ledger.Succeeded)
	ctx := context.Background()
	if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.DLQURL), MessageBody: aws.String(enqueue.Message{V: 1, ID: ids[0], Kind: "report"}.Encode())}); err != nil {
		t.Fatal(err)
	}
	out := r.must(t, "redrive")
	if !strings.Contains(out, "redrove 0 of 1 dead-letter messages") || !strings.Contains(out, "skipped job "+ids[0]+": already Succeeded") {
		t.Fatalf("redrive of a Succeeded job's copy:\n%s", out)
	}
	after := r.e.RequireState(t, ids[0], ledger.Succeeded)
	if after.Attempt != before.Attempt || r.e.QueueDepth(t, r.e.QueueURL) != 0 || r.e.QueueDepth(t, r.e.DLQURL) != 0 {
		t.Fatalf("the Succeeded job was sent again: attempt %d -> %d, queue %d, DLQ %d", before.Attempt, after.Attempt, r.e.QueueDepth(t, r.e.QueueURL), r.e.QueueDepth(t, r.e.DLQURL))
	}
}

// TestRequeueAllOnlyAsListed: between RequeueAll's listing of the Failed
// jobs and its requeue, another operator requeued one and it Succeeded.
// It is left alone, reported, and not run again (it was requeued and ran
// a second time).
func TestRequeueAllOnlyAsListed(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ids := r.failed(t, 2, "listed")
	ft, cfg := r.e.Faulty()
	a, err := admin.New(settings.Settings{AWS: cfg, Table: r.e.Table, QueueURL: r.e.QueueURL, DLQURL: r.e.DLQURL, Retention: handler.DefaultRetention})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	meanwhile := func() { // the other operator, once the listing is read
		if _, err := r.e.Client.Requeue(ctx, ids[0]); err != nil {
			t.Error(err)
		}
		r.e.Drain(t, r.h)
	}
	// Just before RequeueAll's own requeue of that job is sent (the
	// listing is done): Match runs as the request is picked, faults none.
	var once sync.Once
	ft.Add(faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Pass, Match: func(b []byte) bool {
		if bytes.Contains(b, []byte(ids[0])) {
			once.Do(meanwhile)
		}
		return false
	}})
	rep, err := a.RequeueAll(ctx, ledger.Filter{State: ledger.Failed}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var changed *enqueue.StateChangedError
	if rep.Done() != 1 || !errors.As(rep.Err(), &changed) || changed.JobID != ids[0] || changed.State != ledger.Succeeded {
		t.Fatalf("requeued %d, errors %v; want 1 and the Succeeded job left alone", rep.Done(), rep.Err())
	}
	r.e.Drain(t, r.h)
	if rec := r.e.RequireState(t, ids[0], ledger.Succeeded); rec.Attempt != 1 {
		t.Fatalf("the job that had Succeeded ran again: attempt %d", rec.Attempt)
	}
	r.e.RequireState(t, ids[1], ledger.Succeeded)
}

// TestDashboardRefusesEveryInterface: ":8080" listens on every interface
// (it was accepted though the docs said non-loopback is refused); only
// --allow-remote lets a non-loopback address through.
func TestDashboardRefusesEveryInterface(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	for _, addr := range []string{":0", "0.0.0.0:0", "[::]:0"} {
		_, _, err := r.cli(t, "dashboard", "--addr", addr)
		if !errors.Is(err, ErrNotLoopback) {
			t.Errorf("dashboard --addr %s: %v; want ErrNotLoopback", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0"} {
		if !loopback(addr) {
			t.Errorf("%s is loopback", addr)
		}
	}
}

// failed adds n report jobs that end Failed (the kind broken while they
// run) and returns their ids.
func (r *rig) failed(t *testing.T, n int, prefix string) []string {
	t.Helper()
	r.broken.Store(true)
	ids := r.enqueue(t, n, prefix)
	r.e.Drain(t, r.h)
	r.broken.Store(false)
	return ids
}

// cliAt runs the command line in process as on a terminal answering
// answer (interactive), with the environment env.
func (r *rig) cliAt(t *testing.T, env map[string]string, interactive bool, answer string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	full := map[string]string{settings.EnvTable: r.e.Table, settings.EnvQueueURL: r.e.QueueURL, settings.EnvDLQURL: r.e.DLQURL, "AWS_ENDPOINT_URL": os.Getenv("AWS_ENDPOINT_URL")}
	for k, v := range env {
		full[k] = v
	}
	c := &cli{stdout: &out, stderr: &errOut, getenv: func(k string) string { return full[k] }, stdin: strings.NewReader(answer), interactive: interactive}
	err := c.run(context.Background(), args)
	return out.String(), errOut.String(), err
}

// TestCLIPrintsNoControlCharacters: a record written by an older producer
// (no kind rule then) with an escape sequence, CR/LF, NUL and a bidi
// override in its kind and last error prints them as visible escapes in
// list and get; they reached the terminal raw.
func TestCLIPrintsNoControlCharacters(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ids := r.failed(t, 1, "hostile")
	ctx := context.Background()
	_, err := r.e.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:        aws.String(r.e.Table),
		Key:              map[string]ddbtypes.AttributeValue{ledger.AttrPK: &ddbtypes.AttributeValueMemberS{Value: "j#" + ids[0]}},
		UpdateExpression: aws.String("SET kind = :k, lastError = :e, listErr = :e"),
		ExpressionAttributeValues: map[string]ddbtypes.AttributeValue{
			":k": &ddbtypes.AttributeValueMemberS{Value: "evil\x1b[2J\x00kind"},
			":e": &ddbtypes.AttributeValueMemberS{Value: "ok\r\nFAKE LINE \u202egnp.exe\x1b]0;title\x07"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"list", "Failed"}, {"get", ids[0], "--show-args"}} {
		out := r.must(t, args...)
		for _, raw := range []string{"\x1b", "\r", "\x00", "\u202e", "\x07"} {
			if strings.Contains(out, raw) {
				t.Errorf("nexjob %s printed %q raw:\n%q", args[0], raw, out)
			}
		}
		if !strings.Contains(out, `evil\x1b[2J\x00kind`) || !strings.Contains(out, `\u202e`) {
			t.Errorf("nexjob %s does not show the escapes:\n%s", args[0], out)
		}
	}
}

// TestBulkActionsAsk: on a terminal, delete and bulk requeue ask and a no
// changes nothing; --dry-run names each job and changes nothing; --yes
// skips the question.
func TestBulkActionsAsk(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ids := r.failed(t, 2, "bulk")
	if _, _, err := r.cliAt(t, nil, true, "n\n", "delete", ids[0], ids[1]); !errors.Is(err, ErrNotConfirmed) {
		t.Fatalf("delete answered no: %v", err)
	}
	if _, errOut, err := r.cliAt(t, nil, true, "\n", "requeue", "--state", "Failed"); !errors.Is(err, ErrNotConfirmed) || !strings.Contains(errOut, "requeue every Failed job? [y/N]") {
		t.Fatalf("bulk requeue with no answer: %v %q", err, errOut)
	}
	out, _, err := r.cliAt(t, nil, true, "", "delete", ids[0], ids[1], "--dry-run")
	if err != nil || !strings.Contains(out, "would delete "+ids[0]+" (Failed, report)") || !strings.Contains(out, "would delete "+ids[1]) {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	out, _, err = r.cliAt(t, nil, true, "", "redrive", "--dry-run")
	if err != nil || !strings.Contains(out, "dry run: 0 messages shown") {
		t.Fatalf("redrive dry run: %v\n%s", err, out)
	}
	for _, id := range ids {
		r.e.RequireState(t, id, ledger.Failed) // nothing changed
	}
	if _, _, err := r.cliAt(t, nil, true, "y\n", "delete", ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.cliAt(t, nil, true, "", "requeue", ids[1], "--yes"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.e.Client.Store().Get(context.Background(), ids[0]); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("after yes, the job is still there: %v", err)
	}
	r.e.RequireState(t, ids[1], ledger.Enqueued)
	// An error names its job.
	_, _, err = r.cliAt(t, nil, false, "", "requeue", ids[1])
	if err == nil || !strings.Contains(err.Error(), ids[1]) {
		t.Fatalf("requeue of an active job: %v; want the job named", err)
	}
}

// TestRealAccountAsked: with no AWS_ENDPOINT_URL, provision and demo
// would create resources in a real account; they print the account and
// region and, with no terminal to ask, refuse without --yes.
func TestRealAccountAsked(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	noEndpoint := map[string]string{"AWS_ENDPOINT_URL": ""} // the SDK still reaches the emulator: its STS says who
	name := r.e.Table + "-real"
	_, errOut, err := r.cliAt(t, noEndpoint, false, "", "provision", name)
	if err == nil || !strings.Contains(err.Error(), "refusing without --yes") || !strings.Contains(errOut, "REAL AWS account 123456789012") || !strings.Contains(errOut, "region us-east-1") {
		t.Fatalf("provision with no endpoint: %v\n%s", err, errOut)
	}
	if _, _, err := r.cliAt(t, noEndpoint, true, "n\n", "demo"); !errors.Is(err, ErrNotConfirmed) {
		t.Fatalf("demo answered no: %v", err)
	}
	if _, err := r.e.DB.DescribeTable(context.Background(), &dynamodb.DescribeTableInput{TableName: aws.String(name)}); err == nil {
		t.Fatal("the refused provision created its table")
	}
}

// TestSchedules: `nexjob schedules` lists the recurring jobs with their
// next firing (they were invisible to operators).
func TestSchedules(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	group := "cli-" + r.e.Table[len(r.e.Table)-9:]
	if _, err := scheduler.NewFromConfig(r.e.Cfg).CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(group)}); err != nil {
		t.Fatal(err)
	}
	rc := recurring.New(r.e.Cfg, recurring.Options{Group: group, TargetARN: "arn:aws:lambda:us-east-1:123456789012:function:t", RoleARN: "arn:aws:iam::123456789012:role/s"})
	if err := rc.Recurring(ctx, "nightly-report", "cron(0 2 * * ? *)", report{Name: "n"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := rc.Recurring(ctx, "paused", "rate(5 minutes)", report{Name: "p"}, &recurring.Opts{Disabled: true, Concurrency: recurring.AllowConcurrent}); err != nil {
		t.Fatal(err)
	}
	before := time.Now() // the CLI's clock reads between before and after
	out, errOut, err := r.cliAt(t, map[string]string{settings.EnvScheduleGroup: group}, false, "", "schedules")
	if err != nil {
		t.Fatalf("schedules: %v\n%s", err, errOut)
	}
	n1, _ := recurring.Next("cron(0 2 * * ? *)", "", time.Time{}, before)
	n2, _ := recurring.Next("cron(0 2 * * ? *)", "", time.Time{}, time.Now())
	nexts := regexp.QuoteMeta(n1.UTC().Format(time.RFC3339)) + "|" + regexp.QuoteMeta(n2.UTC().Format(time.RFC3339))
	if !regexpLine(out, `nightly-report\s+report\s+cron\(0 2 \* \* \? \*\)(?: UTC)?\s+SkipIfRunning\s+(`+nexts+`).*`) ||
		!regexpLine(out, `paused\s+report\s+rate\(5 minutes\)(?: UTC)?\s+AllowConcurrent\s+disabled`) {
		t.Fatalf("schedules:\n%s", out)
	}
	if _, _, err := r.cliAt(t, nil, false, "", "schedules"); !errors.Is(err, admin.ErrNoSchedules) {
		t.Fatalf("with no group: %v", err)
	}
}

// TestStatsShowsEachQueue: nexjob stats prints a line per named queue
// (NEXJOB_QUEUES) with its own counts.
func TestStatsShowsEachQueue(t *testing.T) {
	e := nexjobtest.New(t, &nexjobtest.Options{Queues: []string{"bulk", "payments"}})
	for i := range 3 {
		if _, err := e.Client.Enqueue(context.Background(), report{Name: fmt.Sprint(i)}, &enqueue.Opts{Queue: "bulk"}); err != nil {
			t.Fatal(err)
		}
	}
	qs, _ := json.Marshal(map[string]settings.NamedQueue{
		"bulk":     {URL: e.Queues["bulk"], DLQURL: e.QueueDLQs["bulk"]},
		"payments": {URL: e.Queues["payments"]},
	})
	env := map[string]string{settings.EnvTable: e.Table, settings.EnvQueueURL: e.QueueURL, settings.EnvDLQURL: e.DLQURL, settings.EnvQueues: string(qs)}
	var out bytes.Buffer
	c := &cli{stdout: &out, stderr: &out, getenv: func(k string) string { return env[k] }}
	if err := c.run(context.Background(), []string{"stats"}); err != nil {
		t.Fatalf("stats: %v\n%s", err, out.String())
	}
	lines := map[string]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = strings.Join(f, " ")
		}
	}
	if lines["bulk"] != "bulk 3 0 0" || lines["payments"] != "payments 0 0 none configured" || !strings.Contains(out.String(), "job queue: 0 waiting") {
		t.Fatalf("stats:\n%s\nwant bulk with 3 waiting and an empty DLQ, payments with none", out.String())
	}
}

// TestRedriveFromANamedQueue: redrive --from NAME reads that named
// queue's DLQ, and the job goes back to its own queue, not the job queue;
// a name not among NEXJOB_QUEUES is refused.
func TestRedriveFromANamedQueue(t *testing.T) {
	e := nexjobtest.New(t, &nexjobtest.Options{Queues: []string{"bulk"}})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, report{Name: "r"}, &enqueue.Opts{Queue: "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	// Its message reached the bulk queue's DLQ (as after maxReceiveCount).
	got, err := e.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(e.Queues["bulk"]), WaitTimeSeconds: 1})
	if err != nil || len(got.Messages) != 1 {
		t.Fatalf("receive the job's message: %v %d", err, len(got.Messages))
	}
	if _, err := e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(e.QueueDLQs["bulk"]), MessageBody: got.Messages[0].Body}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.SQS.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(e.Queues["bulk"]), ReceiptHandle: got.Messages[0].ReceiptHandle}); err != nil {
		t.Fatal(err)
	}
	qs, _ := json.Marshal(map[string]settings.NamedQueue{"bulk": {URL: e.Queues["bulk"], DLQURL: e.QueueDLQs["bulk"]}})
	env := map[string]string{settings.EnvTable: e.Table, settings.EnvQueueURL: e.QueueURL, settings.EnvDLQURL: e.DLQURL, settings.EnvQueues: string(qs)}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		c := &cli{stdout: &out, stderr: &out, getenv: func(k string) string { return env[k] }}
		err := c.run(ctx, args)
		return out.String(), err
	}
	if out, err := run("redrive", "--from", "imports", "--yes"); !errors.Is(err, enqueue.ErrUnknownQueue) {
		t.Fatalf("redrive --from an unknown queue: %v\n%s", err, out)
	}
	out, err := run("redrive", "--from", "bulk", "--yes")
	if err != nil || !strings.Contains(out, "redrove 1 of 1 dead-letter messages") {
		t.Fatalf("redrive --from bulk: %v\n%s", err, out)
	}
	if got := [3]int{e.QueueDepth(t, e.Queues["bulk"]), e.QueueDepth(t, e.QueueDLQs["bulk"]), e.QueueDepth(t, e.QueueURL)}; got != [3]int{1, 0, 0} {
		t.Fatalf("bulk queue, its DLQ, the job queue: %v, want [1 0 0] (job %s back on its own queue)", got, res.ID)
	}
}
