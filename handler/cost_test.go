package handler_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestPathCosts pins the AWS requests of each lifecycle path and their
// units (docs/costs.md's table; the worker's receives and deletes belong
// to the event source mapping and are not counted). Items here are under
// 1 KB: a write is 1 write unit, 2 in a transaction.
func TestPathCosts(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	meter := e.Meter(&cfg)
	clk := &clock{}
	fails := map[string]int{} // a job's failures to come, by its args
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(_ context.Context, j *handler.Job[email]) error {
		if fails[j.Args.To] > 0 {
			fails[j.Args.To]--
			return errors.New("down")
		}
		return nil
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }})
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Ledger: ledger.Options{Now: clk.Now}, MaxDelay: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := h.Producer()
	p := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: -1})
	ctx := context.Background()
	step := meterStep(t, meter)
	runOne := func() {
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
			if n, _ := p.Poll(ctx); n > 0 {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("no message")
	}
	enq := func(to string, o *enqueue.Opts) func() {
		return func() {
			if _, err := c.Enqueue(ctx, email{To: to}, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	state := func(id string, want ledger.State) {
		t.Helper()
		if r, _ := c.Store().Get(ctx, id); r.State != want {
			t.Fatalf("job %s is %s, want %s", id, r.State, want)
		}
	}
	put, upd, get, send, tx := "DynamoDB.PutItem", "DynamoDB.UpdateItem", "DynamoDB.GetItem", "SQS.SendMessage", "DynamoDB.TransactWriteItems"
	type u = awstest.Units

	// Within MaxDelay (15 min in production, 1 s here): one delayed send.
	var sched enqueue.Result
	step("scheduled within MaxDelay: enqueue", []string{put, send}, u{Write: 1, Index: 1, Sends: 1}, func() {
		sched, err = c.Enqueue(ctx, email{To: "near@example.com"}, &enqueue.Opts{Delay: time.Second})
	})
	clk.Advance(time.Second)
	step("scheduled within MaxDelay: due, run", []string{upd, upd}, u{Write: 2, Index: 1}, runOne)
	state(sched.ID, ledger.Succeeded)
	// Beyond it, with no far schedules (NoFarSchedules): a hop a MaxDelay.
	step("scheduled 2 h, hops: enqueue", []string{put, send}, u{Write: 1, Index: 1, Sends: 1}, func() {
		sched, err = c.Enqueue(ctx, email{To: "s@example.com"}, &enqueue.Opts{IdempotencyKey: "cost-s", Delay: 2 * time.Hour})
	})
	step("scheduled 2 h, hops: one hop carried forward", []string{send}, u{Sends: 1}, runOne)
	clk.Advance(2 * time.Hour)
	step("scheduled 2 h, hops: due, run", []string{upd, upd}, u{Write: 2, Index: 1}, runOne)
	state(sched.ID, ledger.Succeeded)

	var parent, child enqueue.Result
	step("continuation: parent enqueue", []string{put, send}, u{Write: 1, Sends: 1}, func() { parent, _ = c.Enqueue(ctx, email{To: "p@example.com"}, nil) })
	step("continuation: add child", []string{get, tx}, u{Write: 4, Index: 1, Read: 1}, func() { child, _ = c.ContinueWith(ctx, parent.ID, email{To: "c@example.com"}, nil) })
	step("continuation: parent runs, child released", []string{upd, upd, upd, send}, u{Write: 3, Index: 1, Sends: 1}, runOne)
	step("continuation: child runs", []string{upd, upd}, u{Write: 2}, runOne)
	state(child.ID, ledger.Succeeded)

	fails["retry@example.com"] = 1
	var retried enqueue.Result
	step("retry: enqueue", []string{put, send}, u{Write: 1, Sends: 1}, func() { retried, _ = c.Enqueue(ctx, email{To: "retry@example.com"}, nil) })
	step("retry: fails, retried", []string{upd, upd, send}, u{Write: 2, Index: 1, Sends: 1}, runOne)
	clk.Advance(time.Second)
	step("retry: runs again", []string{upd, upd}, u{Write: 2, Index: 1}, runOne)
	state(retried.ID, ledger.Succeeded)

	fails["fails@example.com"] = 1
	var failed enqueue.Result
	step("failed: enqueue", []string{put, send}, u{Write: 1, Sends: 1}, func() { failed, _ = c.Enqueue(ctx, email{To: "fails@example.com"}, &enqueue.Opts{MaxAttempts: 1}) })
	step("failed: fails for good", []string{upd, upd}, u{Write: 2, Index: 1}, runOne)
	step("requeue", []string{upd, send}, u{Write: 1, Index: 1, Sends: 1}, func() { _, err = c.Requeue(ctx, failed.ID) })
	step("requeue: runs", []string{upd, upd}, u{Write: 2}, runOne)
	state(failed.ID, ledger.Succeeded)

	key := &enqueue.Opts{IdempotencyKey: "cost-k"}
	step("keyed: enqueue", []string{put, send}, u{Write: 1, Sends: 1}, enq("k@example.com", key))
	step("duplicate of an active job", []string{put}, u{Write: 1}, enq("k@example.com", key))
	step("keyed: runs", []string{upd, upd}, u{Write: 2}, runOne)
	step("rejection (RejectAlways, the key's job ended)", []string{put}, u{Write: 1}, func() {
		if _, err := c.Enqueue(ctx, email{To: "k@example.com"}, &enqueue.Opts{IdempotencyKey: "cost-k", DuplicatePolicy: ledger.RejectAlways}); err == nil {
			t.Fatal("not rejected")
		}
	})
	step("re-use of a Succeeded key", []string{put, tx, send}, u{Write: 5, Sends: 1}, enq("k@example.com", key))
	step("re-use: runs", []string{upd, upd}, u{Write: 2}, runOne)
	step("re-use with ReplaceEnded of a Succeeded key", []string{put, send}, u{Write: 1, Sends: 1}, enq("k@example.com", &enqueue.Opts{IdempotencyKey: "cost-k", ReplaceEnded: true}))
	step("re-use with ReplaceEnded: runs", []string{upd, upd}, u{Write: 2}, runOne)

	fails["kf@example.com"] = 2
	failedKey := &enqueue.Opts{IdempotencyKey: "cost-kf", MaxAttempts: 1}
	step("keyed, to fail: enqueue", []string{put, send}, u{Write: 1, Sends: 1}, enq("kf@example.com", failedKey))
	step("keyed: fails for good", []string{upd, upd}, u{Write: 2, Index: 1}, runOne)
	step("re-use of a Failed key", []string{put, tx, send}, u{Write: 5, Index: 2, Sends: 1}, enq("kf@example.com", failedKey))
	step("re-use of a Failed key: fails for good", []string{upd, upd}, u{Write: 2, Index: 1}, runOne)
	step("re-use with ReplaceEnded of a Failed key", []string{put, send}, u{Write: 1, Index: 1, Sends: 1}, enq("kf@example.com", &enqueue.Opts{IdempotencyKey: "cost-kf", ReplaceEnded: true}))
	step("re-use with ReplaceEnded: runs", []string{upd, upd}, u{Write: 2}, runOne)
}

// stepper returns a function that runs do and checks the requests it
// made, counted by counter, against want.
func stepper(t *testing.T, counter *awstest.Counter) func(name string, want []string, do func()) {
	return func(name string, want []string, do func()) {
		t.Helper()
		counter.Reset()
		do()
		if got := counter.Calls(); !slices.Equal(got, want) {
			t.Errorf("%s: requests\n got %v\nwant %v", name, got, want)
		}
	}
}

// meterStep is stepper with the requests' units (awstest.Units) checked
// too, and both logged: the figures docs/costs.md copies (go test -v).
func meterStep(t *testing.T, m *awstest.Meter) func(name string, want []string, units awstest.Units, do func()) {
	return func(name string, want []string, units awstest.Units, do func()) {
		t.Helper()
		m.Reset()
		do()
		got, gotUnits := m.Calls(), m.Units()
		t.Logf("%s: %v; %v", name, got, gotUnits)
		if !slices.Equal(got, want) {
			t.Errorf("%s: requests\n got %v\nwant %v", name, got, want)
		}
		if gotUnits != units {
			t.Errorf("%s: units\n got %v\nwant %v", name, gotUnits, units)
		}
	}
}

// TestCheckCosts: the dispatch guard's check of a job that was sent and
// ran (the common case) costs the worker one eventually consistent
// GetItem, half a read unit, and nothing else; docs/costs.md prices the
// guard's check from it.
func TestCheckCosts(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	meter := e.Meter(&cfg)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](ok), nil)
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := h.Producer().Enqueue(ctx, email{To: "checked@example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Purge(t, e.QueueURL)
	handle := func(m enqueue.Message) {
		ev := events.SQSEvent{Records: []events.SQSMessage{{MessageId: m.ID, ReceiptHandle: "not-a-receipt", Body: m.Encode()}}}
		if resp, err := h.Handle(ctx, ev); err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("%+v %v", resp, err)
		}
	}
	handle(enqueue.Message{V: 1, ID: res.ID, Kind: "email"})
	step := meterStep(t, meter)
	step("the guard's check of a job that ran", []string{"DynamoDB.GetItem"}, awstest.Units{Read: 0.5}, func() {
		handle(enqueue.Message{V: 1, ID: res.ID, Kind: "email", Check: true})
	})
	if rec := e.Get(t, res.ID); rec.State != ledger.Succeeded || rec.Attempt != 1 {
		t.Fatalf("the job: %s attempt %d", rec.State, rec.Attempt)
	}
}

// TestRunHistoryWeighs: what a record's last three run ends (each error
// cut to ledger.MaxAttemptError bytes) and its three write nonces weigh
// at their largest, measured as stored after three runs that failed with
// 1 KB errors and the run that succeeded: docs/costs.md's "at most about
// 0.9 KB more item".
func TestRunHistoryWeighs(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	clk := &clock{}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(_ context.Context, j *handler.Job[email]) error {
		if j.Attempt <= 3 {
			return errors.New(strings.Repeat("e", 1024))
		}
		return nil
	}), &handler.KindOptions{Backoff: func(int) time.Duration { return time.Second }})
	h, err := handler.New(e.Cfg, e.Table, e.QueueURL, reg, &handler.Options{Ledger: ledger.Options{Now: clk.Now}, MaxDelay: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := h.Producer().Enqueue(ctx, email{To: "history@example.com"}, &enqueue.Opts{MaxAttempts: 4})
	if err != nil {
		t.Fatal(err)
	}
	p := poller.New(e.SQS, e.QueueURL, h.Handle, &poller.Options{WaitTime: -1})
	weight := func() int {
		out, err := e.DB.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(e.Table), ConsistentRead: aws.Bool(true),
			Key: map[string]types.AttributeValue{ledger.AttrPK: &types.AttributeValueMemberS{Value: "j#" + res.ID}}})
		if err != nil || out.Item == nil {
			t.Fatalf("read: %v", err)
		}
		part := map[string]types.AttributeValue{}
		for _, a := range []string{ledger.AttrHist0, ledger.AttrHist1, ledger.AttrHist2, ledger.AttrNonce, ledger.AttrNonce1, ledger.AttrNonce2} {
			if v, ok := out.Item[a]; ok {
				part[a] = v
			}
		}
		return awstest.ItemSize(part)
	}
	most := 0
	for attempt := 1; attempt <= 4; attempt++ {
		for end := time.Now().Add(10 * time.Second); ; {
			if n, _ := p.Poll(ctx); n > 0 {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("attempt %d: no message", attempt)
			}
			time.Sleep(50 * time.Millisecond)
		}
		clk.Advance(time.Second)
		most = max(most, weight())
	}
	if rec := e.Get(t, res.ID); rec.State != ledger.Succeeded || rec.Attempt != 4 {
		t.Fatalf("the job: %s attempt %d", rec.State, rec.Attempt)
	}
	t.Logf("three run ends with 240-byte errors and three nonces: %d bytes at most", most)
	if most != 911 {
		t.Errorf("the run history and nonces weigh %d bytes at most, want %d", most, 911)
	}
}
