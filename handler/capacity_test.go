package handler_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/capacity"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// countingWriter counts the bytes written to it.
type countingWriter struct{ n atomic.Int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n.Add(int64(len(p))); return len(p), nil }

// TestCapacityModel measures what a keyed job costs from enqueue to
// Succeeded (its requests, counted; its write units; the bytes the worker
// and the producer log with production settings: JSON at Info, EMF
// metrics) and prints the capacity model at 1k, 10k and 100k jobs/s from
// those figures and AWS's published limits (package capacity). The README
// copies the table: go test -run TestCapacityModel -v ./handler/
func TestCapacityModel(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	cfg := e.Cfg.Copy()
	counter := awstest.Count(&cfg)
	var workerLog, producerLog countingWriter
	// What lambdamain sets up: JSON on stdout with the function's name,
	// EMF metrics on the same stream.
	wlog := slog.New(slog.NewJSONHandler(&workerLog, nil)).With("function", "worker")
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[email](func(context.Context, *handler.Job[email]) error { return nil }), nil)
	h, err := handler.New(cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: wlog, Metrics: metrics.New(&metrics.Options{Out: &workerLog})})
	if err != nil {
		t.Fatal(err)
	}
	c, err := enqueue.New(cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{
		Logger: slog.New(slog.NewJSONHandler(&producerLog, nil)), Metrics: metrics.New(&metrics.Options{Out: &producerLog}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const jobs = 50
	for i := range jobs {
		if _, err := c.Enqueue(ctx, email{To: "user-" + strconv.Itoa(i) + "@example.com"}, &enqueue.Opts{IdempotencyKey: "welcome-" + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	p := poller.New(sqs.NewFromConfig(cfg), e.QueueURL, h.Handle, &poller.Options{WaitTime: -1, BatchSize: 10, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for done, end := 0, time.Now().Add(time.Minute); done < jobs; {
		n, err := p.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		done += n
		if time.Now().After(end) {
			t.Fatalf("%d of %d jobs run in a minute", done, jobs)
		}
	}
	calls := map[string]int{}
	for _, op := range counter.Calls() {
		calls[op]++
	}
	writes := calls["DynamoDB.PutItem"] + calls["DynamoDB.UpdateItem"] + calls["DynamoDB.TransactWriteItems"]
	sqsCalls := calls["SQS.SendMessage"] + calls["SQS.ReceiveMessage"] + calls["SQS.DeleteMessageBatch"]
	for _, r := range e.Scan(t) {
		if r.State != ledger.Succeeded {
			t.Fatalf("job %s is %s", r.ID, r.State)
		}
	}
	raw, err := e.DB.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(e.Table)})
	if err != nil {
		t.Fatal(err)
	}
	size := 0
	for _, it := range raw.Items {
		size = max(size, awstest.ItemSize(it))
	}
	if writes != 3*jobs || size > 1024 {
		t.Fatalf("%d jobs made %d DynamoDB writes, the largest item %d bytes: want 3 writes of under 1 KB each", jobs, writes, size)
	}
	job := capacity.PerJob{
		WriteUnits:  float64(writes) / jobs,
		SQSRequests: float64(sqsCalls) / jobs,
		LogBytes:    float64(workerLog.n.Load()) / jobs,
	}
	if job.LogBytes == 0 || producerLog.n.Load() == 0 {
		t.Fatal("nothing logged")
	}
	// A far job, measured with its dispatch guard (TestFarJobTakesOneSchedule).
	_, creates, firings := farJobFootprint(t)
	job.FarCreates, job.FarFirings = float64(creates), float64(firings)
	t.Logf("per job, %d keyed jobs from enqueue to Succeeded: %v; %.1f write units (largest item %d bytes); %.2f SQS requests (%d sends, %d receives, %d delete batches); worker log %.1f bytes, producer log %.1f bytes; a far job: %.0f CreateSchedule, %.0f firing",
		jobs, calls, job.WriteUnits, size, job.SQSRequests, calls["SQS.SendMessage"], calls["SQS.ReceiveMessage"], calls["SQS.DeleteMessageBatch"], job.LogBytes, float64(producerLog.n.Load())/jobs, job.FarCreates, job.FarFirings)
	w := capacity.Workload{
		RunSeconds: 0.1, WriteSeconds: 0.015, BatchSize: 10, Concurrency: handler.DefaultConcurrency,
		IndexedShare: 0.1, IndexShards: 16, FarShare: 0.01, LogPricePerGB: 0.5,
	}
	t.Logf("workload: %+v; worker logs $%.3f per million jobs, producer logs $%.3f", w,
		capacity.At(1, job, w).LogUSDPerMillion, float64(producerLog.n.Load())/jobs*1e6/1e9*w.LogPricePerGB)
	t.Logf("capacity model:\n%s", capacity.Table([]float64{1000, 10000, 100000}, job, w))
}
