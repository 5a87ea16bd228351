package handler_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// Durable jobs' benchmarks (issue 39 item 14), on the emulator: make bench.

type benchSteps struct {
	N     int  `json:"n"`
	Sleep bool `json:"sleep,omitempty"` // sleep after the steps: a second run replays them
}

func (benchSteps) Kind() string { return "bench-steps" }

type benchRig struct {
	e     *nexjobtest.Env
	h     *handler.Handler
	meter *awstest.Meter
}

// newBenchRig is the rig; metered, its requests are counted and their
// units read (a read of each item before and after each write: not for
// timing).
func newBenchRig(b *testing.B, metered bool) *benchRig {
	b.Helper()
	r := &benchRig{e: nexjobtest.New(b, nil)}
	if metered {
		cfg := r.e.Cfg
		r.meter = awstest.NewMeter(&cfg, r.e.DB).Queries()
		r.e.Cfg = cfg
	}
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[benchSteps](func(ctx context.Context, j *handler.Job[benchSteps]) error {
		for i := range j.Args.N {
			if _, err := handler.Step(ctx, "s"+strconv.Itoa(i), func(context.Context) (int, error) { return i, nil }); err != nil {
				return err
			}
		}
		if j.Args.Sleep {
			return handler.Sleep(ctx, "nap", time.Second)
		}
		return nil
	}), nil)
	r.h = r.e.Handler(b, reg, &handler.Options{Logger: quiet, Lease: 20 * time.Minute})
	return r
}

// run runs job id until it leaves Enqueued and Processing (and, with
// ended, until it ends), under a 15-minute invocation (a job of 10,000
// steps outlasts the kit's 30 s).
func (r *benchRig) run(b *testing.B, id string, ended bool) ledger.Record {
	b.Helper()
	p := poller.New(r.e.SQS, r.e.QueueURL, r.h.Handle, &poller.Options{WaitTime: time.Second, FunctionTimeout: 15 * time.Minute})
	for {
		rec, err := r.e.Client.Store().Get(context.Background(), id)
		if err != nil {
			b.Fatal(err)
		}
		if rec.State != ledger.Enqueued && rec.State != ledger.Processing && (!ended || rec.State.Terminal()) {
			return rec
		}
		if _, err := p.Poll(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDurableJobSteps: a job of N steps recorded in one run, then
// its replay (a sleep after the steps: the woken run replays all N), per
// job: requests, write and read units (reported), and wall time (ns/op,
// both runs, the meter's reads included: see BenchmarkStepVsPutItem for
// a step's time). With the steps table: each step one PutItem of 1 write
// unit; the replay one Query per MB.
func BenchmarkDurableJobSteps(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("steps=%d", n), func(b *testing.B) {
			r := newBenchRig(b, true)
			var reqs, wu, replayReqs int
			var ru, replayRU float64
			for range b.N {
				// n steps in all: n-1 of the worker's and the sleep's
				// (10,000 is ledger.MaxJobSteps).
				res, err := r.e.Client.Enqueue(context.Background(), benchSteps{N: n - 1, Sleep: true}, nil)
				if err != nil {
					b.Fatal(err)
				}
				r.meter.Reset()
				if rec := r.run(b, res.ID, false); rec.State != ledger.Scheduled {
					b.Fatalf("after its steps: %s (%s)", rec.State, rec.LastError)
				}
				reqs, wu, ru = len(r.meter.Calls()), r.meter.Units().Write, r.meter.Units().Read
				r.e.RunNow(b, res.ID)
				r.meter.Reset()
				if rec := r.run(b, res.ID, true); rec.State != ledger.Succeeded {
					b.Fatalf("after its replay: %s (%s)", rec.State, rec.LastError)
				}
				replayReqs, replayRU = len(r.meter.Calls()), r.meter.Units().Read
			}
			b.ReportMetric(float64(reqs), "requests/record")
			b.ReportMetric(float64(wu), "WU/record")
			b.ReportMetric(ru, "RU/record")
			b.ReportMetric(float64(replayReqs), "requests/replay")
			b.ReportMetric(replayRU, "RU/replay")
		})
	}
}

// BenchmarkStepVsPutItem: one step recorded in a run (ns/op a step, its
// PutItem included) against the bare SDK's PutItem of the same item with
// the same condition: the difference is the step's own cost.
func BenchmarkStepVsPutItem(b *testing.B) {
	b.Run("step", func(b *testing.B) {
		r := newBenchRig(b, false)
		res, err := r.e.Client.Enqueue(context.Background(), benchSteps{N: b.N}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		if rec := r.run(b, res.ID, true); rec.State != ledger.Succeeded {
			b.Fatalf("%s (%s)", rec.State, rec.LastError)
		}
	})
	b.Run("bare", func(b *testing.B) {
		e := nexjobtest.New(b, nil)
		ctx := context.Background()
		b.ResetTimer()
		for i := range b.N {
			_, err := e.DB.PutItem(ctx, &dynamodb.PutItemInput{
				TableName: aws.String(e.StepsTable),
				Item: map[string]types.AttributeValue{
					ledger.AttrPK: &types.AttributeValueMemberS{Value: "aaaaaaaaaaaaaaaaaaaaaaaaaa"}, ledger.AttrStepKey: &types.AttributeValueMemberS{Value: "0/s" + strconv.Itoa(i)},
					ledger.AttrStepValue: &types.AttributeValueMemberS{Value: strconv.Itoa(i)}, ledger.AttrStepAt: &types.AttributeValueMemberN{Value: "1796600000000"},
					ledger.AttrExpiresAt: &types.AttributeValueMemberN{Value: "1860000000"},
				},
				ConditionExpression: aws.String("attribute_not_exists(#pk)"), ExpressionAttributeNames: map[string]string{"#pk": ledger.AttrPK},
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}
