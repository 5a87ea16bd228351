package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/idempotency"
)

type httpReq = events.APIGatewayV2HTTPRequest
type httpResp = events.APIGatewayV2HTTPResponse

// A whole Lambda handler wrapped, its key and payload found by JMESPath
// as Powertools users write them: the repeat gets the first response,
// marked replayed; a changed body is a mismatch; an event with no key
// runs nothing.
func TestHandlerByExpressions(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	runs := 0
	h, err := idempotency.Handler(r.s, func(_ context.Context, req httpReq) (httpResp, error) {
		runs++
		return httpResp{StatusCode: 201, Body: fmt.Sprintf(`{"charge":"ch_%d"}`, runs)}, nil
	}, &idempotency.HandlerOptions[httpReq, httpResp]{
		KeyPath:     `headers."idempotency-key"`,
		PayloadPath: `powertools_json(body).[amount, currency]`,
		Replayed: func(r httpResp) httpResp {
			r.Headers = map[string]string{"Idempotent-Replayed": "true"}
			return r
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	req := httpReq{Headers: map[string]string{"idempotency-key": "k-1"}, Body: `{"amount":100,"currency":"EUR","note":"a"}`}
	first, err := h(context.Background(), req)
	if err != nil || first.StatusCode != 201 || first.Headers["Idempotent-Replayed"] != "" {
		t.Fatalf("first: %+v %v", first, err)
	}
	req.Body = `{"amount":100,"currency":"EUR","note":"only the note differs"}`
	again, err := h(context.Background(), req)
	if err != nil || again.Body != first.Body || again.Headers["Idempotent-Replayed"] != "true" || runs != 1 {
		t.Fatalf("repeat: %+v %v, %d runs", again, err, runs)
	}
	req.Body = `{"amount":999,"currency":"EUR"}`
	if _, err := h(context.Background(), req); !errors.Is(err, idempotency.ErrPayloadMismatch) {
		t.Fatalf("another amount: %v, want a mismatch", err)
	}
	if _, err := h(context.Background(), httpReq{Body: "{}"}); !errors.Is(err, idempotency.ErrNoKey) || runs != 1 {
		t.Fatalf("no key: %v, %d runs", err, runs)
	}
	if _, err := idempotency.Handler(r.s, func(context.Context, httpReq) (httpResp, error) { return httpResp{}, nil },
		&idempotency.HandlerOptions[httpReq, httpResp]{KeyPath: "headers.["}); err == nil {
		t.Fatal("a bad expression was accepted")
	}
}

// An SQS batch, record by record: a failed record is reported in
// BatchItemFailures and runs again when it comes back; the records that
// succeeded are replayed, not run, when the whole batch is redelivered.
// On a FIFO queue the first failure fails the rest of the batch.
func TestSQSBatchPartialFailure(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var mu sync.Mutex
	runs := map[string]int{}
	failing := map[string]bool{"m2": true}
	h, err := idempotency.SQSBatch(r.s, func(_ context.Context, m events.SQSMessage) error {
		mu.Lock()
		defer mu.Unlock()
		runs[m.MessageId]++
		if failing[m.MessageId] {
			return errors.New("downstream down")
		}
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch := func(arn string, ids ...string) events.SQSEvent {
		var ev events.SQSEvent
		for _, id := range ids {
			ev.Records = append(ev.Records, events.SQSMessage{MessageId: id, Body: "{}", EventSourceARN: arn})
		}
		return ev
	}
	std := "arn:aws:sqs:us-east-1:000000000000:orders"
	resp, err := h(context.Background(), batch(std, "m1", "m2", "m3"))
	if err != nil || len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != "m2" {
		t.Fatalf("first delivery: %+v %v, want m2 failed", resp, err)
	}
	failing["m2"] = false
	resp, err = h(context.Background(), batch(std, "m1", "m2", "m3"))
	if err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("redelivery: %+v %v", resp, err)
	}
	if runs["m1"] != 1 || runs["m2"] != 2 || runs["m3"] != 1 {
		t.Fatalf("runs %v, want m1 1, m2 2, m3 1", runs)
	}
	failing["f2"] = true
	resp, err = h(context.Background(), batch(std+".fifo", "f1", "f2", "f3"))
	var failed []string
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	if err != nil || fmt.Sprint(failed) != "[f2 f3]" || runs["f3"] != 0 {
		t.Fatalf("FIFO: failed %v, runs %v; want f2 and f3 failed, f3 not run", failed, runs)
	}
}

// Kinesis and DynamoDB stream batches are ordered: the first failure
// fails the rest unrun (the mapping retries from it), and on the retry the
// records before it are replayed, not run again.
func TestStreamBatchesAreOrdered(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	var mu sync.Mutex
	runs := map[string]int{}
	failing := map[string]bool{}
	work := func(id string) error {
		mu.Lock()
		defer mu.Unlock()
		runs[id]++
		if failing[id] {
			return errors.New("downstream down")
		}
		return nil
	}
	kin, err := idempotency.KinesisBatch(r.s, func(_ context.Context, rec events.KinesisEventRecord) error {
		return work("k" + rec.Kinesis.SequenceNumber)
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ddb, err := idempotency.DynamoDBStreamBatch(r.s, func(_ context.Context, rec events.DynamoDBEventRecord) error {
		return work("d" + rec.Change.SequenceNumber)
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var kev events.KinesisEvent
	var dev events.DynamoDBEvent
	for _, n := range []string{"1", "2", "3"} {
		kev.Records = append(kev.Records, events.KinesisEventRecord{EventID: "shardId-0:" + n, Kinesis: events.KinesisRecord{SequenceNumber: n}})
		dev.Records = append(dev.Records, events.DynamoDBEventRecord{EventID: "ev-" + n, Change: events.DynamoDBStreamRecord{SequenceNumber: n}})
	}
	failing["k2"], failing["d2"] = true, true
	kr, err := kin(context.Background(), kev)
	if err != nil || fmt.Sprint(kr.BatchItemFailures) != "[{2} {3}]" {
		t.Fatalf("kinesis: %+v %v, want 2 and 3 failed", kr, err)
	}
	dr, err := ddb(context.Background(), dev)
	if err != nil || fmt.Sprint(dr.BatchItemFailures) != "[{2} {3}]" {
		t.Fatalf("dynamodb stream: %+v %v, want 2 and 3 failed", dr, err)
	}
	failing["k2"], failing["d2"] = false, false
	if kr, err := kin(context.Background(), kev); err != nil || len(kr.BatchItemFailures) != 0 {
		t.Fatalf("kinesis retry: %+v %v", kr, err)
	}
	if dr, err := ddb(context.Background(), dev); err != nil || len(dr.BatchItemFailures) != 0 {
		t.Fatalf("dynamodb stream retry: %+v %v", dr, err)
	}
	for _, p := range []string{"k", "d"} {
		if runs[p+"1"] != 1 || runs[p+"2"] != 2 || runs[p+"3"] != 1 {
			t.Fatalf("runs %v, want %s1 once, %s2 twice, %s3 once (never before 2 succeeded)", runs, p, p, p)
		}
	}
	if _, err := idempotency.Records(r.s, func(string) string { return "" }, func(context.Context, string) error { return nil }, nil); err == nil {
		t.Fatal("Records without keying options was accepted")
	}
}
