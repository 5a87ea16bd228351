package enqueue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

const racers = 50

// raceRounds runs rounds of racers concurrent Enqueue calls, each round on
// a fresh key, and returns what was wrong: more than one record or message
// per key, or callers told different ids.
func raceRounds(t *testing.T, e *awstest.Env, c *enqueue.Client, rounds int) []string {
	t.Helper()
	var problems []string
	roundIDs := make([]map[string]int, rounds)
	for r := range rounds {
		key := fmt.Sprintf("race-%d", r)
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			ids   = map[string]int{}
			start = make(chan struct{})
		)
		for range racers {
			wg.Go(func() {
				<-start
				res, err := c.Enqueue(context.Background(), payment{OrderID: key}, &enqueue.Opts{IdempotencyKey: key})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					problems = append(problems, fmt.Sprintf("round %d: %v", r, err))
					return
				}
				ids[res.ID]++
			})
		}
		close(start)
		wg.Wait()
		if len(ids) != 1 {
			problems = append(problems, fmt.Sprintf("round %d: callers got %d different ids", r, len(ids)))
		}
		roundIDs[r] = ids
		n := 0
		for _, rec := range e.Records(t) {
			if rec.KeyHash == c.Store().HashKey(key) {
				n++
			}
		}
		if n != 1 {
			problems = append(problems, fmt.Sprintf("round %d: %d records for the key", r, n))
		}
	}
	sent := map[string]int{}
	for _, m := range e.Messages(t, e.QueueURL) {
		msg, err := enqueue.DecodeMessage(aws.ToString(m.Body))
		if err != nil {
			t.Fatal(err)
		}
		sent[msg.ID]++
	}
	for r, ids := range roundIDs {
		n := 0
		for id := range ids {
			n += sent[id]
		}
		if n != 1 {
			problems = append(problems, fmt.Sprintf("round %d: %d SQS messages", r, n))
		}
	}
	return problems
}

// TestRaceOneJobPerKey: 50 goroutines enqueue the same key at once, 20
// rounds. It needs DynamoDB served one request at a time (the default
// emulator's launcher serialises it; real DynamoDB is atomic per item).
//
// That it can fail is shown by TestRaceDetectsUnconditionalWrite, which
// runs the same check with the condition stripped from the write.
func TestRaceOneJobPerKey(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, nil)
	for _, p := range raceRounds(t, e, c, 20) {
		t.Error(p)
	}
}

// unconditional is a fault: it drops the condition from every PutItem.
type unconditional struct{ ledger.DynamoDB }

func (u unconditional) PutItem(ctx context.Context, in *dynamodb.PutItemInput, o ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	cp := *in
	cp.ConditionExpression, cp.ExpressionAttributeNames, cp.ExpressionAttributeValues = nil, nil, nil
	return u.DynamoDB.PutItem(ctx, &cp, o...)
}

// TestRaceDetectsUnconditionalWrite proves the race check can fail: with a
// plain PutItem every racer "creates" its own job.
func TestRaceDetectsUnconditionalWrite(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, &enqueue.ClientOptions{DynamoDB: unconditional{e.DB}})
	if p := raceRounds(t, e, c, 1); len(p) == 0 {
		t.Fatal("the race check found nothing wrong with unconditional writes")
	}
}
