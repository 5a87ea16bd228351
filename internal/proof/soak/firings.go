package soak

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/recurring"
)

// producerSkew is how far ahead the second producer's clock runs.
const producerSkew = 300 * time.Millisecond

// The index shard counts one producer and one worker are deployed with,
// beside the default (DefaultIndexShards) of the rest: a count changed
// between deployments, both ways; every listing must still show every job.
const (
	moreShards  = 40
	fewerShards = 4
)

// ledgerOn is a ledger store over env's table with opts, through no fault.
func ledgerOn(env Env, opts ledger.Options) *ledger.Store {
	opts.BlobBucket = "" // its steps are not read here
	st, err := ledger.New(dynamodb.NewFromConfig(env.Cfg), env.Table, &opts)
	if err != nil {
		panic(err) // options the soak set itself
	}
	return st
}

// fire plays EventBridge Scheduler for one recurring schedule
// (SkipIfRunning) until ctx ends: a firing every 150 to 450 ms, each an
// hour of scheduled time after the last, and the nemesis of its
// deliveries: a firing delivered twice (30 %), and a late retry of an
// earlier firing after later ones came (20 %, as Scheduler retries a
// firing whose call failed). Each call is recorded with the firing's
// scheduled time for checkFirings.
func fire(ctx context.Context, c *enqueue.Client, led *ledgerOf, rng *rand.Rand) {
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var sent []string
	call := func(at string) {
		args, _ := json.Marshal(Fired{N: int(rng.Int32())})
		f := recurring.Firing{V: 1, ID: "soak-hourly", Kind: (Fired{}).Kind(), Args: args, Concurrency: recurring.SkipIfRunning, ScheduledTime: at, MaxAttempts: 3}
		r := &result{call: "firing", kind: f.Kind, firing: at, at: time.Now()}
		res, err := recurring.Fire(ctx, c, f)
		r.done = time.Now()
		led.add(record(r, res, err))
	}
	for i := 0; ctx.Err() == nil; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(150+rng.IntN(300)) * time.Millisecond):
		}
		at := base.Add(time.Duration(i) * time.Hour).Format(time.RFC3339)
		sent = append(sent, at)
		call(at)
		if rng.Float64() < 0.3 {
			call(at) // delivered twice
		}
		if len(sent) > 1 && rng.Float64() < 0.2 {
			call(sent[rng.IntN(len(sent)-1)]) // a late retry of an earlier firing
		}
	}
}
