package completion_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodbstreams"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/completion"
	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

type charge struct{ Card string }

func (charge) Kind() string { return "charge" }

type refund struct{ Card string }

func (refund) Kind() string { return "refund" }

const secret = "4111-1111-secret"

// rig is a table whose jobs ended (one Succeeded, one Failed, one
// Expired), a bus with a rule sending the Succeeded and Failed ends to a
// queue, and the table's stream read by the guard and a publisher.
type rig struct {
	e      *awstest.Env
	bus    string
	target string // the rule's queue
	ids    map[ledger.State]string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ctx := context.Background()
	e := awstest.New(t, nil)
	r := &rig{e: e, bus: e.Table, ids: map[ledger.State]string{}}
	eb := eventbridge.NewFromConfig(e.Cfg)
	if _, err := eb.CreateEventBus(ctx, &eventbridge.CreateEventBusInput{Name: aws.String(r.bus)}); err != nil {
		t.Fatal(err)
	}
	q, err := e.SQS.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(e.Table + "-ends")})
	if err != nil {
		t.Fatal(err)
	}
	r.target = aws.ToString(q.QueueUrl)
	attrs, err := e.SQS.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.SQS.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: q.QueueUrl})
		_, _ = eb.RemoveTargets(context.Background(), &eventbridge.RemoveTargetsInput{Rule: aws.String("ends"), EventBusName: aws.String(r.bus), Ids: []string{"q"}})
		_, _ = eb.DeleteRule(context.Background(), &eventbridge.DeleteRuleInput{Name: aws.String("ends"), EventBusName: aws.String(r.bus)})
		_, _ = eb.DeleteEventBus(context.Background(), &eventbridge.DeleteEventBusInput{Name: aws.String(r.bus)})
	})
	// What a team's consumer writes: the ends it reacts to.
	pattern := `{"source":["nexjob"],"detail-type":["nexjob job ended"],"detail":{"state":["Succeeded","Failed"]}}`
	if _, err := eb.PutRule(ctx, &eventbridge.PutRuleInput{Name: aws.String("ends"), EventBusName: aws.String(r.bus), EventPattern: aws.String(pattern)}); err != nil {
		t.Fatal(err)
	}
	if _, err := eb.PutTargets(ctx, &eventbridge.PutTargetsInput{Rule: aws.String("ends"), EventBusName: aws.String(r.bus),
		Targets: []ebtypes.Target{{Id: aws.String("q"), Arn: aws.String(attrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)])}}}); err != nil {
		t.Fatal(err)
	}

	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[charge](func(context.Context, *handler.Job[charge]) error { return nil }), nil)
	handler.AddWorker(reg, handler.WorkFunc[refund](func(context.Context, *handler.Job[refund]) error {
		return handler.Permanent(errors.New("card declined"))
	}), nil)
	h := e.Handler(t, reg, nil)
	for st, args := range map[ledger.State]enqueue.JobArgs{ledger.Succeeded: charge{Card: secret}, ledger.Failed: refund{Card: secret}} {
		res, err := e.Client.Enqueue(ctx, args, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.ids[st] = res.ID
	}
	runAt := e.Now().Add(time.Minute)
	res, err := e.Client.Enqueue(ctx, charge{Card: secret}, &enqueue.Opts{RunAt: runAt, Deadline: runAt.Add(time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	r.ids[ledger.Expired] = res.ID
	e.Drain(t, h)
	e.Advance(t, 2*time.Minute)
	e.Drain(t, h)
	for st, id := range r.ids {
		e.RequireState(t, id, st)
	}
	return r
}

// poller reads the stream for the guard and pub, as the two event source
// mappings do.
func (r *rig) poller(pub *completion.Publisher) *guard.StreamPoller {
	g := guard.New(r.e.SQS, r.e.QueueURL, nil)
	return guard.NewStreamPoller(r.e.DB, dynamodbstreams.NewFromConfig(r.e.Cfg), r.e.Table, g).Also(pub.Publish)
}

// delivered is what the rule's queue holds: each message an event as
// EventBridge delivers it, its detail decoded.
func (r *rig) delivered(t *testing.T) ([]completion.Event, []string) {
	t.Helper()
	var evs []completion.Event
	var bodies []string
	for _, m := range r.e.Messages(t, r.target) {
		var env struct {
			Source     string           `json:"source"`
			DetailType string           `json:"detail-type"`
			Detail     completion.Event `json:"detail"`
		}
		body := aws.ToString(m.Body)
		if err := json.Unmarshal([]byte(body), &env); err != nil {
			t.Fatalf("event %s: %v", body, err)
		}
		if env.Source != completion.Source || env.DetailType != completion.DetailType {
			t.Fatalf("event from %q, %q", env.Source, env.DetailType)
		}
		evs = append(evs, env.Detail)
		bodies = append(bodies, body)
	}
	return evs, bodies
}

// recording is a real EventBridge client that keeps what it was asked to
// put, and can refuse the first entry of its first call (FailedEntryCount,
// as EventBridge does when throttled inside a call that succeeded).
type recording struct {
	*eventbridge.Client
	mu       sync.Mutex
	put      []string // details
	calls    int
	refuseAt int // 1-based call whose first entry is refused; 0: none
}

func (c *recording) PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, o ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error) {
	c.mu.Lock()
	c.calls++
	refuse := c.calls == c.refuseAt
	c.mu.Unlock()
	entries := in.Entries
	if refuse {
		entries = entries[1:]
	}
	out, err := c.Client.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries}, o...)
	if err != nil {
		return out, err
	}
	c.mu.Lock()
	for _, e := range entries {
		c.put = append(c.put, aws.ToString(e.Detail))
	}
	c.mu.Unlock()
	if refuse {
		out.Entries = append([]ebtypes.PutEventsResultEntry{{ErrorCode: aws.String("ThrottlingException"), ErrorMessage: aws.String("injected")}}, out.Entries...)
		out.FailedEntryCount++
	}
	return out, nil
}

// TestEndsReachARule: each job's end, read from the stream, is one
// event on the bus, where a team's rule picks the ones it wants (here
// Succeeded and Failed: the Expired one is published and not matched);
// an event names the job and its end, never its args; a second read of
// the stream publishes nothing more. Pinned: one PutEvents request for
// the three ends, no DynamoDB request.
func TestEndsReachARule(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	cfg := r.e.Cfg.Copy()
	calls := awstest.Count(&cfg)
	eb := &recording{Client: eventbridge.NewFromConfig(cfg)}
	pub := completion.New(eb, &completion.Options{Bus: r.bus})
	sp := r.poller(pub)
	if err := sp.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := calls.Calls(); !slices.Equal(got, []string{"EventBridge.PutEvents"}) {
		t.Fatalf("publishing three ends made %v; want one PutEvents", got)
	}
	if len(eb.put) != 3 {
		t.Fatalf("published %d events, want 3 (one per end): %v", len(eb.put), eb.put)
	}
	evs, bodies := r.delivered(t)
	got := map[string]completion.Event{}
	for _, ev := range evs {
		got[ev.ID] = ev
	}
	if len(evs) != 2 || got[r.ids[ledger.Succeeded]].State != ledger.Succeeded || got[r.ids[ledger.Failed]].State != ledger.Failed {
		t.Fatalf("the rule delivered %+v; want the Succeeded and the Failed job's ends", evs)
	}
	if f := got[r.ids[ledger.Failed]]; f.Kind != "refund" || f.Attempt != 1 || !strings.Contains(f.Error, "card declined") || f.EventID == "" || f.EndedAt.IsZero() {
		t.Fatalf("the Failed job's event: %+v", f)
	}
	for _, b := range append(bodies, eb.put...) {
		if strings.Contains(b, secret) {
			t.Fatalf("an event carries the job's args: %s", b)
		}
	}
	if err := sp.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(eb.put) != 3 {
		t.Fatalf("a second read of the stream published %d events in all, want the 3", len(eb.put))
	}
}

// TestPublishUnderFaults: PutEvents throttled past the SDK's retries
// fails the batch, which comes again (Lambda's retry: here the poller's
// iterator stays) and is published then; an entry EventBridge refused
// inside a call that succeeded is sent again, once; a lost reply's
// resend publishes the batch twice, each copy with the same EventID (at
// least once, as the package says).
func TestPublishUnderFaults(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ft, fc := r.e.Faulty()
	eb := &recording{Client: eventbridge.NewFromConfig(fc), refuseAt: 2}
	sp := r.poller(completion.New(eb, &completion.Options{Bus: r.bus}))
	h := ft.Add(faults.Rule{Op: "EventBridge.PutEvents", Fault: faults.Throttle, Times: faults.Attempts})
	if err := sp.Poll(context.Background()); err == nil {
		t.Fatal("PutEvents throttled past the SDK's retries: the batch did not fail")
	}
	if h.Fired() != faults.Attempts || len(r.e.Messages(t, r.target)) != 0 {
		t.Fatalf("throttled %d times, %d delivered; want every attempt, none", h.Fired(), len(r.e.Messages(t, r.target)))
	}
	// Next read: the first entry refused once, sent again.
	if err := sp.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	evs, _ := r.delivered(t)
	if len(evs) != 2 || eb.calls != 3 {
		t.Fatalf("after the retry: %d delivered in %d calls; want the 2 matched, in 2 calls (the refused entry again)", len(evs), eb.calls)
	}

	// A lost reply, on a table with one more end.
	r2 := newRig(t)
	ft2, fc2 := r2.e.Faulty()
	sp2 := r2.poller(completion.New(eventbridge.NewFromConfig(fc2), &completion.Options{Bus: r2.bus}))
	h2 := ft2.Add(faults.Rule{Op: "EventBridge.PutEvents", Fault: faults.LostReply})
	if err := sp2.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h2.Fired() != 1 {
		t.Fatalf("lost reply fired %d times", h2.Fired())
	}
	evs, _ = r2.delivered(t)
	ids := map[string]int{}
	for _, ev := range evs {
		ids[ev.EventID]++
	}
	if len(evs) != 4 || len(ids) != 2 {
		t.Fatalf("after a lost reply: %d delivered with %d event ids; want each of the 2 twice, same id", len(evs), len(ids))
	}
}
