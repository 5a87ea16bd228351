package enqueue

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.opentelemetry.io/otel/attribute"

	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/metrics"
)

// Item is one job of EnqueueMany.
type Item struct {
	Args JobArgs
	Opts *Opts
}

// ItemResult is what EnqueueMany did with one item.
type ItemResult struct {
	Result
	// Recorded: the job is in the ledger (new, or the active duplicate).
	Recorded bool
	// Sent: its message is on the queue (for a duplicate, already sent
	// earlier, or re-sent now).
	Sent bool
	// Err is the item's error: an *InputError or a policy rejection
	// (nothing written), a *DispatchError (recorded, not sent: a caller
	// retrying the item's key re-sends it, and the dispatch guard sends
	// it otherwise), or an AWS error of its write.
	Err error
}

// BatchError: some items of EnqueueMany failed; Failed lists their
// indexes. Every other item succeeded.
type BatchError struct {
	Failed []int
	Errs   []error // in the order of Failed
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("nexjob: %d items of the batch failed, the first (item %d): %v", len(e.Failed), e.Failed[0], e.Errs[0])
}

// Unwrap gives the items' errors to errors.Is and errors.As.
func (e *BatchError) Unwrap() []error { return e.Errs }

// manyWriters bounds EnqueueMany's concurrent ledger writes.
const manyWriters = 8

// batchSender is the SQS client's SendMessageBatch; a client without it
// sends one message per job.
type batchSender interface {
	SendMessageBatch(context.Context, *sqs.SendMessageBatchInput, ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
}

// EnqueueMany enqueues items and returns one ItemResult each, in order.
// Each item is decided as Enqueue decides it (its own conditional write,
// the same policy matrix, its RateLimit), up to 8 at a time; then the
// jobs to send go out in SendMessageBatch requests of ten. Items with a
// Debounce are debounced as Enqueue does, one after another in the
// batch's order (so a key's last item is the burst's last args), each
// new window's job sent on its own. The error is nil when every item
// succeeded, else a *BatchError naming the failed items; each
// ItemResult says whether its job was recorded and sent. An item that
// failed can be retried alone with its key.
//
// Cost: one write per item (as Enqueue), a tenth of an SQS request per
// sent job instead of one.
func (c *Client) EnqueueMany(ctx context.Context, items []Item) ([]ItemResult, error) {
	ctx, span := c.startSpan(ctx, "enqueue_many", attribute.Int("nexjob.items", len(items)), attribute.Int("messaging.batch.message_count", len(items)))
	defer span.End()
	out := make([]ItemResult, len(items))
	recs := make([]ledger.Record, len(items))
	toSend := make([]bool, len(items))
	var wg sync.WaitGroup
	sem := make(chan struct{}, manyWriters)
	var debounced []int
	for i, it := range items {
		if it.Opts != nil && it.Opts.Debounce != nil {
			debounced = append(debounced, i)
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			recs[i], toSend[i], out[i] = c.record(ctx, it)
		}()
	}
	// Debounced items one after another, in the batch's order: a key's
	// last item is its last fold, whose args run.
	for _, i := range debounced {
		recs[i], toSend[i], out[i] = c.record(ctx, items[i])
	}
	wg.Wait()

	// Batches of ten of one queue each (a batch request names one queue).
	var queues []string
	batches := map[string][]int{}
	for i := range items {
		if !toSend[i] {
			continue
		}
		q := recs[i].Queue
		if _, seen := batches[q]; !seen {
			queues = append(queues, q)
		}
		if batches[q] = append(batches[q], i); len(batches[q]) == 10 {
			c.sendBatch(ctx, batches[q], recs, out)
			batches[q] = batches[q][:0]
		}
	}
	for _, q := range queues {
		if len(batches[q]) > 0 {
			c.sendBatch(ctx, batches[q], recs, out)
		}
	}
	// A duplicate of a job this batch sent (two items of one key) is sent
	// only if that job's message was: the same DispatchError otherwise.
	sender := map[string]int{}
	for i := range items {
		if toSend[i] {
			sender[out[i].ID] = i
		}
	}
	for i := range items {
		if j, ok := sender[out[i].ID]; ok && !toSend[i] && out[i].Err == nil && !out[j].Sent {
			out[i].Sent, out[i].Err = false, out[j].Err
		}
	}
	var be BatchError
	for i, r := range out {
		if r.Err != nil {
			be.Failed, be.Errs = append(be.Failed, i), append(be.Errs, r.Err)
		}
	}
	if len(be.Failed) > 0 {
		span.RecordError(&be)
		return out, &be
	}
	return out, nil
}

// record validates and writes one item; send says whether its message is
// to be sent.
func (c *Client) record(ctx context.Context, it Item) (ledger.Record, bool, ItemResult) {
	o := effective(it.Args, it.Opts)
	rec, err := c.newRecord(it.Args, &o, viaEnqueueMany)
	if err != nil {
		return rec, false, ItemResult{Err: err}
	}
	if o.Debounce != nil {
		return rec, false, c.debounce(ctx, rec, &o) // it sends its own
	}
	return c.decide(ctx, rec, &o, viaEnqueueMany)
}

// sendBatch sends the jobs at idx, all of one queue, in one
// SendMessageBatch and records each outcome in out.
func (c *Client) sendBatch(ctx context.Context, idx []int, recs []ledger.Record, out []ItemResult) {
	b, ok := c.sqs.(batchSender)
	var near []int
	for _, i := range idx {
		if _, delay := c.message(recs[i]); !ok || c.far != nil && delay > c.farAfter {
			c.sent(ctx, recs[i], &out[i], c.Dispatch(ctx, recs[i])) // one by one: far jobs take a schedule each
			continue
		}
		near = append(near, i)
	}
	if idx = near; len(idx) == 0 {
		return
	}
	// A duplicate's queue may be one taken out since: the job queue then.
	queue, url := c.route(ctx, recs[idx[0]].Queue, recs[idx[0]].ID)
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(url)}
	attrs := traceAttributes(ctx)
	for _, i := range idx {
		msg, delay := c.message(recs[i])
		msg.Queue = queue
		in.Entries = append(in.Entries, sqstypes.SendMessageBatchRequestEntry{
			Id:                      aws.String(strconv.Itoa(i)),
			MessageBody:             aws.String(msg.Encode()),
			DelaySeconds:            c.delaySeconds(delay),
			MessageAttributes:       attrs,
			MessageSystemAttributes: xrayAttribute(ctx, c.xray),
		})
	}
	resp, err := b.SendMessageBatch(ctx, in)
	if err != nil {
		for _, i := range idx {
			c.sent(ctx, recs[i], &out[i], fmt.Errorf("nexjob: send job %s: %w", recs[i].ID, err))
		}
		return
	}
	failed := map[string]error{}
	for _, f := range resp.Failed {
		failed[aws.ToString(f.Id)] = fmt.Errorf("nexjob: send job: SQS refused the entry: %s %s", aws.ToString(f.Code), aws.ToString(f.Message))
	}
	for _, i := range idx {
		c.sent(ctx, recs[i], &out[i], failed[strconv.Itoa(i)])
	}
}

// sent records the outcome of one job's send, as Enqueue does.
func (c *Client) sent(ctx context.Context, rec ledger.Record, r *ItemResult, err error) {
	if err != nil {
		bctx, cancel := bookkeeping(ctx)
		defer cancel()
		if mErr := c.store.MarkUndispatched(bctx, rec.ID); mErr != nil {
			c.log.ErrorContext(ctx, "nexjob: could not mark an unsent job; the dispatch guard will find it", "job_id", rec.ID, "err", mErr)
		}
		r.Err = &DispatchError{JobID: rec.ID, Err: c.missing(err)}
		return
	}
	r.Sent = true
	if rec.Undispatched {
		bctx, cancel := bookkeeping(ctx)
		defer cancel()
		if err := c.store.ClearUndispatched(bctx, rec.ID); err != nil {
			c.log.WarnContext(ctx, "nexjob: could not clear the unsent mark", "job_id", rec.ID, "err", err)
		}
	}
	if !r.Duplicate && !r.Folded {
		c.log.LogAttrs(ctx, slog.LevelInfo, "nexjob: enqueued", slog.String("job_id", rec.ID), slog.String("kind", rec.Kind), slog.String("state", string(rec.State)))
		c.metrics.Count(metrics.Enqueued, rec.Kind, rec.ID)
	}
}
