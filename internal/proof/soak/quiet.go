package soak

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/ledger"
)

// waitQuiet waits until no record is active and every queue is empty,
// twice in a row. It gives up once nothing moved for limit (see
// quietWait), or after most in all.
func waitQuiet(ctx context.Context, env Env, st *ledger.Store, limit, most time.Duration) error {
	db := dynamodb.NewFromConfig(env.Cfg)
	q := sqs.NewFromConfig(env.Cfg)
	w := quietWait{limit: limit, most: most}
	var last string
	for quiet := 0; ; {
		recs, err := scanWith(ctx, db, quietScan(env.Table))
		if err != nil {
			return err
		}
		active, one, newest := 0, "", int64(0)
		for _, r := range recs {
			newest = max(newest, r.UpdatedAt)
			if !r.State.Terminal() {
				active++
				one = fmt.Sprintf("%s %s (attempt %d)", r.ID, r.State, r.Attempt)
			}
		}
		msgs := 0
		for _, url := range []string{env.QueueURL, env.DLQURL, env.BulkURL, env.BulkDLQURL} {
			if url != "" {
				msgs += depth(ctx, q, url)
			}
		}
		last = fmt.Sprintf("%d active records (one: %s), %d messages in the queues", active, one, msgs)
		if active == 0 && msgs == 0 {
			if quiet++; quiet == 2 {
				return nil
			}
		} else {
			quiet = 0
		}
		if why := w.look(time.Now(), active+msgs, newest); why != "" {
			return fmt.Errorf("not quiet after %s (%s): %s", w.waited(time.Now()).Round(time.Second), why, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(quietLook):
		}
	}
}

// quietMost bounds the whole wait: five times c.Quiet, or 300 ms a job
// when that is longer. The backlog the faults leave grows with the jobs
// (the 10k soak at seed 1796607287893335803 was still ending records
// every look, 1,920 left, at a fixed 15 minutes; at seed
// 1796617402104937314, on a machine busy with other tests, the drain
// took 24m36s of 150 ms a job's 25 minutes); a system that moves for ever
// is still caught, at a bound that grows with the work, not with time,
// and one stuck is caught sooner ("nothing moved" for c.Quiet).
func quietMost(c Config) time.Duration {
	return max(5*c.Quiet, time.Duration(c.Jobs)*300*time.Millisecond)
}

// quietLook is the time between two looks. Each look reads the whole
// table and the queues' depths, which moto computes by walking each
// queue: at 500 ms, with the whole items read, the looks took half the
// emulator's time in the 5k soak's drain (py-spy, seed 20261206), and the
// system they waited for drained at half its pace.
const quietLook = 2 * time.Second

// quietScan reads of each item only what a look needs.
func quietScan(table string) *dynamodb.ScanInput {
	proj := expression.NamesList(expression.Name("id"), expression.Name("state"), expression.Name("attempt"), expression.Name("updatedAt"))
	e, err := expression.NewBuilder().WithProjection(proj).Build()
	if err != nil {
		panic(err) // fixed names: cannot fail
	}
	return &dynamodb.ScanInput{
		TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		ProjectionExpression: e.Projection(), ExpressionAttributeNames: e.Names(),
	}
}

// quietWait tells a system still draining from one that is stuck. The
// wait for quiet had a fixed 3 minutes: under load (a backlog of
// thousands of messages after the outage, the emulator at a whole core)
// a system that ended records every second was failed as not quiet, each
// record still in the backlog reported as one left waiting, like a
// record no one would ever touch. Now the wait goes on while the system
// moves (fewer active records and messages than ever seen, or any record
// written since the last look) and fails once nothing moved for limit:
// a record stuck while the rest drains is still reported, limit after
// the rest is done. most bounds the wait in all (a system that moves
// for ever, a job retried in a loop, is not quiet).
type quietWait struct {
	limit, most   time.Duration
	start, moved  time.Time
	least, newest int64
}

// look records what one look at the system saw: left, its active records
// and messages, and newest, the latest UpdatedAt of any record. It
// returns why the wait ends in failure, or "" to go on.
func (w *quietWait) look(now time.Time, left int, newest int64) string {
	if w.start.IsZero() {
		w.start, w.moved, w.least, w.newest = now, now, int64(left), newest
	}
	if int64(left) < w.least || newest > w.newest {
		w.moved = now
	}
	w.least, w.newest = min(w.least, int64(left)), max(w.newest, newest)
	switch {
	case now.Sub(w.moved) >= w.limit:
		return fmt.Sprintf("nothing moved for %s", w.limit)
	case now.Sub(w.start) >= w.most:
		return fmt.Sprintf("still moving, the most the wait takes is %s", w.most)
	}
	return ""
}

// waited is how long the wait has lasted.
func (w *quietWait) waited(now time.Time) time.Duration { return now.Sub(w.start) }
