package handler_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/benchcmp"
	"github.com/nexjob/nexjob-aws/metrics"
)

// cannedJob answers the worker's two UpdateItems as DynamoDB would: the
// claim with the job Processing, the finish (the write conditional on the
// claim's token) with it Succeeded.
func cannedJob(id string) func(body []byte) []byte {
	rec := func(state, nonce string) []byte {
		ms := strconv.FormatInt(time.Now().UnixMilli(), 10)
		lease := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
		return []byte(`{"Attributes":{"pk":{"S":"j#` + id + `"},"id":{"S":"` + id + `"},"kind":{"S":"email"},` +
			`"args":{"S":"{\"to\":\"someone@example.com\",\"subject\":\"hello\"}"},"state":{"S":"` + state + `"},` +
			`"attempt":{"N":"1"},"maxAttempts":{"N":"25"},"token":{"N":"1"},"createdAt":{"N":"` + ms + `"},` +
			`"updatedAt":{"N":"` + ms + `"},"leaseUntil":{"N":"` + lease + `"},"nonce":{"S":"` + nonce + `"}}}`)
	}
	claim, finish := rec("Processing", "aaaaaaaaaaaaaaaa"), rec("Succeeded", "bbbbbbbbbbbbbbbb")
	return func(body []byte) []byte {
		if bytes.Contains(body, []byte(`#token = :token`)) {
			return finish
		}
		return claim
	}
}

// BenchmarkRatioHandle: (b) the worker's Handle of a batch of one job
// against the canned endpoint, vs the bare two UpdateItems a hand-written
// worker makes (claim with its condition, decode the args, finish
// conditional on the claim's token), with the same expressions.
func BenchmarkRatioHandle(b *testing.B) {
	canned := benchcmp.NewCanned(b)
	const id = "aaaaaaaaaaaaaaaaaaaaaaaaaa"
	// The sizes of the last claim and finish: the bare side's must match ours.
	var claimSize, finishSize int
	reply := cannedJob(id)
	canned.Update = func(body []byte) []byte {
		if bytes.Contains(body, []byte(`#token = :token`)) {
			finishSize = len(body)
		} else {
			claimSize = len(body)
		}
		return reply(body)
	}
	cfg := canned.Config()
	const table, queue = "jobs", "http://sqs.local/000000000000/jobs"
	reg := handler.NewRegistry()
	ran := 0
	handler.AddWorker(reg, handler.WorkFunc[email](func(ctx context.Context, j *handler.Job[email]) error {
		ran++
		return nil
	}), nil)
	// Production settings: Info logs and EMF metrics (what lambdamain
	// turns on), each line formatted and written to /dev/null with a
	// write(2), as to Lambda's stdout.
	sink := benchcmp.LogSink(b)
	h, err := handler.New(cfg, table, queue, reg, &handler.Options{Logger: slog.New(slog.NewJSONHandler(sink, nil)), Metrics: metrics.New(&metrics.Options{Out: sink})})
	if err != nil {
		b.Fatal(err)
	}
	ev := events.SQSEvent{Records: []events.SQSMessage{{
		MessageId: "m-1", ReceiptHandle: "r-1", Body: enqueue.Message{V: 1, ID: id, Kind: "email"}.Encode(),
	}}}
	db := dynamodb.NewFromConfig(cfg)
	// As under Lambda, the invocation has a deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var oursClaim, oursFinish int
	benchcmp.RatioRounds(b, "handle-one-job", benchcmp.InMemoryRounds, func(b *testing.B) {
		for b.Loop() {
			resp, err := h.Handle(ctx, ev)
			if err != nil || len(resp.BatchItemFailures) != 0 {
				b.Fatal(resp, err)
			}
		}
		if ran == 0 {
			b.Fatal("the worker never ran")
		}
		oursClaim, oursFinish = claimSize, finishSize
	}, func(b *testing.B) {
		for b.Loop() {
			if err := bareRun(ctx, db, table, id); err != nil {
				b.Fatal(err)
			}
		}
		for _, c := range [][2]int{{claimSize, oursClaim}, {finishSize, oursFinish}} {
			if d := c[0] - c[1]; d > c[1]/50 || d < -c[1]/50 {
				b.Fatalf("bare UpdateItem is %d bytes, ours %d: the comparison is not like for like", c[0], c[1])
			}
		}
	})
}

// bareRun is the hand-written worker: Claim's and Finish's UpdateItems,
// writing what ours writes (the nonce shift register, the run history)
// with the same expressions, names and values.
func bareRun(ctx context.Context, db *dynamodb.Client, table, id string) error {
	now := time.Now()
	ms := strconv.FormatInt(now.UnixMilli(), 10)
	s, n := benchcmp.S, benchcmp.N
	key := map[string]types.AttributeValue{"pk": s("j#" + id)}
	out, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table),
		Key:       key,
		ConditionExpression: aws.String("#id = :id AND #attempt < #maxAttempts AND (#state = :enq OR " +
			"(#state = :sch AND #runAt <= :now) OR (#state = :proc AND #leaseUntil <= :now))"),
		UpdateExpression: aws.String("SET #state = :proc, #leaseUntil = :lease, #updatedAt = :now, " +
			"#attempt = #attempt + :one, #token = #token + :one, #nonce2 = if_not_exists(#nonce1, :noNonce), " +
			"#nonce1 = if_not_exists(#nonce, :noNonce), #nonce = :nonce REMOVE #listState, #listAt"),
		ExpressionAttributeNames: map[string]string{"#id": "id", "#attempt": "attempt", "#maxAttempts": "maxAttempts",
			"#state": "state", "#runAt": "runAt", "#leaseUntil": "leaseUntil", "#updatedAt": "updatedAt",
			"#token": "token", "#nonce": "nonce", "#nonce1": "nonce1", "#nonce2": "nonce2",
			"#listState": "listState", "#listAt": "listAt"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":id": s(id), ":enq": s("Enqueued"),
			":sch": s("Scheduled"), ":proc": s("Processing"), ":now": n(ms),
			":lease": n(strconv.FormatInt(now.Add(time.Minute).UnixMilli(), 10)), ":one": n("1"),
			":noNonce": s("-"), ":nonce": s("aaaaaaaaaaaaaaaa")},
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err != nil {
		return err
	}
	var args email
	if a, ok := out.Attributes["args"].(*types.AttributeValueMemberS); ok {
		if err := json.Unmarshal([]byte(a.Value), &args); err != nil {
			return err
		}
	}
	token := "1"
	if t, ok := out.Attributes["token"].(*types.AttributeValueMemberN); ok {
		token = t.Value
	}
	done := strconv.FormatInt(time.Now().UnixMilli(), 10)
	_, err = db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(table),
		Key:                 key,
		ConditionExpression: aws.String("#id = :id AND #token = :token AND #state = :proc"),
		UpdateExpression: aws.String("SET #state = :st, #updatedAt = :now, #hist2 = if_not_exists(#hist1, :noHist), " +
			"#hist1 = if_not_exists(#hist0, :noHist), #hist0 = :hist, #runAt = :runAt, #expiresAt = :exp, " +
			"#nonce2 = if_not_exists(#nonce1, :noNonce), #nonce1 = if_not_exists(#nonce, :noNonce), #nonce = :nonce " +
			"REMOVE #leaseUntil, #listState, #listAt, #lastError, #listErr, #cutOffs"),
		ExpressionAttributeNames: map[string]string{"#id": "id", "#token": "token", "#state": "state",
			"#updatedAt": "updatedAt", "#hist0": "hist0", "#hist1": "hist1", "#hist2": "hist2", "#runAt": "runAt",
			"#expiresAt": "expiresAt", "#nonce": "nonce", "#nonce1": "nonce1", "#nonce2": "nonce2",
			"#leaseUntil": "leaseUntil", "#listState": "listState", "#listAt": "listAt",
			"#lastError": "lastError", "#listErr": "listErr", "#cutOffs": "cutOffs"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":id": s(id), ":token": n(token),
			":proc": s("Processing"), ":st": s("Succeeded"), ":now": n(done), ":runAt": n(ms), // the run's start: an ended job's RunAt
			":noHist": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{}},
			":hist": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
				"n": n(out.Attributes["attempt"].(*types.AttributeValueMemberN).Value), "at": n(done), "st": s("Succeeded")}},
			":exp":     n(strconv.FormatInt(now.Add(7*24*time.Hour).Unix(), 10)),
			":noNonce": s("-"), ":nonce": s("bbbbbbbbbbbbbbbb")},
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return err
}
