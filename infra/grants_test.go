package infra_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/infra"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/onetime"
	"github.com/nexjob/nexjob-aws/recurring"
	"github.com/nexjob/nexjob-aws/settings"
)

type chore struct{ N int }

func (chore) Kind() string { return "chore" }

// TestDashboardGrantsExactlyItsCalls runs every action of a write
// dashboard (look, requeue, cancel, delete, redrive) against the emulator
// through the recording proxy, and compares the AWS actions it called with
// the write dashboard role's policy in the template: each call granted,
// and nothing granted that no action calls (the role had PutItem, which
// with SendMessage would let it forge jobs, DescribeTable and the DLQ's
// ChangeMessageVisibility).
func TestDashboardGrantsExactlyItsCalls(t *testing.T) {
	e := nexjobtest.New(t, &nexjobtest.Options{BlobBucket: true})
	ctx := context.Background()
	rec := newRecorder(t, os.Getenv("AWS_ENDPOINT_URL"))
	cfg := e.Cfg.Copy()
	cfg.BaseEndpoint = aws.String(rec.url("dashboard"))
	a, err := admin.New(settings.Settings{AWS: cfg, Table: e.Table, QueueURL: e.QueueURL, DLQURL: e.DLQURL, Retention: handler.DefaultRetention,
		StepsTable: e.StepsTable, BlobBucket: e.BlobBucket})
	if err != nil {
		t.Fatal(err)
	}
	// The all-options stack has recurring jobs: a schedule to list.
	group := "grants-" + e.Table[len(e.Table)-9:]
	if _, err := scheduler.NewFromConfig(e.Cfg).CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(group)}); err != nil {
		t.Fatal(err)
	}
	opts := recurring.Options{Group: group, TargetARN: "arn:aws:lambda:us-east-1:123456789012:function:t", RoleARN: "arn:aws:iam::123456789012:role/s"}
	if err := recurring.New(e.Cfg, opts).Recurring(ctx, "nightly", "cron(0 2 * * ? *)", chore{N: 9}, nil); err != nil {
		t.Fatal(err)
	}
	// And far jobs' one-time schedules, in a group of their own.
	farGroup := "grants-far-" + e.Table[len(e.Table)-9:]
	if _, err := scheduler.NewFromConfig(e.Cfg).CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(farGroup)}); err != nil {
		t.Fatal(err)
	}
	queueARN, err := onetime.QueueARN(e.Cfg.Region, e.QueueURL)
	if err != nil {
		t.Fatal(err)
	}
	dlqARN, err := onetime.QueueARN(e.Cfg.Region, e.DLQURL)
	if err != nil {
		t.Fatal(err)
	}
	farOpts := onetime.Options{Group: farGroup, QueueARN: queueARN, RoleARN: "arn:aws:iam::123456789012:role/far", DeadLetterARN: dlqARN}
	sched, err := admin.New(settings.Settings{AWS: cfg, Table: e.Table, QueueURL: e.QueueURL, DLQURL: e.DLQURL, Retention: handler.DefaultRetention, Schedules: opts, Far: farOpts})
	if err != nil {
		t.Fatal(err)
	}
	// The jobs the actions act on, written by a producer (not recorded).
	store := e.Client.Store()
	job := func(n int) string {
		res, err := e.Client.Enqueue(ctx, chore{N: n}, &enqueue.Opts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		return res.ID
	}
	failed := func(n int) string {
		id := job(n)
		r, err := store.Claim(ctx, id, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Finish(ctx, r, ledger.Finish{State: ledger.Failed, LastError: "boom"}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	toRequeue, toCancel, toDelete, dead := failed(1), job(2), job(3), failed(4)
	if _, err := e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(e.DLQURL), MessageBody: aws.String(enqueue.Message{V: 1, ID: dead, Kind: "chore"}.Encode())}); err != nil {
		t.Fatal(err)
	}
	// A job 30 days ahead (its producer scheduled it), whose copy is in the DLQ.
	farOne, err := onetime.New(scheduler.NewFromConfig(e.Cfg), farOpts)
	if err != nil {
		t.Fatal(err)
	}
	farProducer, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Far: farOne})
	if err != nil {
		t.Fatal(err)
	}
	far, err := farProducer.Enqueue(ctx, chore{N: 30}, &enqueue.Opts{Delay: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	farRec, err := store.Get(ctx, far.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(e.DLQURL), MessageBody: aws.String(enqueue.Message{V: 1, ID: far.ID, Kind: "chore", RunAt: farRec.RunAt}.Encode())}); err != nil {
		t.Fatal(err)
	}

	if _, err := a.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Find(ctx, ledger.Filter{State: ledger.Failed}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Find(ctx, ledger.Filter{State: ledger.Enqueued}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(ctx, toRequeue); err != nil {
		t.Fatal(err)
	}
	// A job whose args are in the blob bucket (over 16 KB), looked at as
	// the job page does: its args read from S3.
	big, err := e.Client.Enqueue(ctx, bigChore{Note: strings.Repeat("n", 20<<10)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if shown, _, err := a.Timeline(ctx, big.ID); err != nil || len(shown.Args) < 20<<10 {
		t.Fatalf("the job page of a job with args in S3: %d bytes, %v", len(shown.Args), err)
	}
	if _, err := a.DeadLetters(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Requeue(ctx, toRequeue); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Cancel(ctx, toCancel, "not needed"); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, toDelete); err != nil {
		t.Fatal(err)
	}
	rep, err := sched.Redrive(ctx, nil) // the far job's schedule is made again
	if err != nil || rep.Done() != 2 {
		t.Fatalf("redrive: %+v %v", rep, err)
	}
	if err := sched.Delete(ctx, far.ID); err != nil { // and removed with it
		t.Fatal(err)
	}
	if _, err := sched.Schedules(ctx); err != nil { // the recurring page
		t.Fatal(err)
	}
	called := rec.calls("dashboard")
	rec.mu.Lock()
	updated := rec.updated["dashboard"]
	rec.mu.Unlock()
	for a := range updated {
		if !slices.Contains(infra.OperatorAttributes, a) {
			t.Errorf("an operator action's UpdateItem names %q, which GrantOperate does not allow (infra.OperatorAttributes)", a)
		}
	}

	doc := allOptions(t, "/nexjob/grants-test/key-secret")
	resources := doc["Resources"].(map[string]any)
	var role any
	for _, res := range resources {
		r := res.(map[string]any)
		if r["Type"] != "AWS::Lambda::Function" {
			continue
		}
		props := r["Properties"].(map[string]any)
		if props["Environment"].(map[string]any)["Variables"].(map[string]any)[settings.EnvRole] == "dashboard" {
			role = props["Role"]
		}
	}
	granted := policyOf(resources, role)
	// UpdateItem creates a missing item: with SendMessage, one naming a
	// kind and args was a forged job the worker ran.
	if allows, _ := updatable(t, resources, role); !slices.ContainsFunc(allows, func(l []string) bool { return slices.Equal(l, infra.OperatorAttributes) }) ||
		slices.ContainsFunc(allows, func(l []string) bool {
			return slices.Contains(l, "*") || slices.Contains(l, ledger.AttrKind) || slices.Contains(l, ledger.AttrArgs)
		}) {
		t.Errorf("the write dashboard's UpdateItem grants: %v; want allow-lists (infra.OperatorAttributes, infra.SignalAttributes), never kind or args", allows)
	}
	for _, c := range called {
		if !granted.allows(c) {
			t.Errorf("the dashboard calls %s, not granted", c)
		}
	}
	for a := range granted {
		// Its logs; the key secret at start; PassRole authorises the role
		// a CreateSchedule names (no call of its own).
		if strings.HasPrefix(a, "logs:") || a == "ssm:GetParameter" || a == "kms:Decrypt" || a == "iam:PassRole" {
			continue
		}
		if !slices.Contains(called, a) {
			t.Errorf("the write dashboard is granted %s, which none of its actions calls (it called %v)", a, called)
		}
	}
}

type bigChore struct{ Note string }

func (bigChore) Kind() string { return "big-chore" }
