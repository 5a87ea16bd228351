package handler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// process handles one message and reports whether it may be deleted.
func (h *Handler) process(ctx context.Context, m events.SQSMessage, stopBefore time.Duration) bool {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < stopBefore {
		// Not claimed: it comes back after the visibility timeout, with no
		// attempt spent.
		// The job's id, when the body names one, so a job's receives can be
		// followed in the logs (it is ours, not a secret: any sender can
		// write a body, and it is logged as a message's).
		id := ""
		if msg, err := enqueue.DecodeMessage(m.Body); err == nil {
			id = msg.ID
		}
		h.log.WarnContext(ctx, "nexjob: invocation nearly over, message left for redelivery", "message_id", m.MessageId, "job_id", id, "left", time.Until(dl))
		return false
	}
	msg, err := enqueue.DecodeMessage(m.Body)
	if err != nil {
		return h.notAJob(ctx, m, err)
	}
	msg.Queue = h.receivedOn(ctx, m, msg.ID) // the queue it came from, not the body's word
	// The producer's trace context: a run is its child, a message sent on
	// (carried forward, a retry) carries it on.
	ctx = enqueue.TraceContextOf(ctx, m, h.o.XRay)
	now := h.store.Now()
	if msg.RunAt > now.UnixMilli() {
		return h.carryForward(ctx, msg, now)
	}
	byCheck := false
	if msg.Check {
		run, first, later, err := h.stillWaiting(ctx, msg, now)
		if err != nil {
			// The read failed (a throttle past the SDK's retries): the
			// check comes back rather than vanish.
			h.log.ErrorContext(ctx, "nexjob: dispatch check failed; it comes back", "job_id", msg.ID, "err", err)
			return false
		}
		if later != 0 {
			msg.RunAt = later // not yet due: the check waits for the new run time
			return h.carryForward(ctx, msg, now)
		}
		if !run {
			return true // the job's own message did its work
		}
		byCheck = first
	}
	e, known := h.reg.lookup(msg.Kind)
	var timeout time.Duration
	if known {
		timeout = e.opts.Timeout
	}
	lease, deadline, cause := h.lease(ctx, now, timeout)
	claim := h.store.Claim
	if byCheck {
		claim = h.store.ClaimByCheck
	}
	claimCtx, cancelClaim := claimContext(ctx)
	rec, err := claim(claimCtx, msg.ID, lease)
	cancelClaim()
	if err != nil {
		h.giveBack(ctx, msg.ID, err)
		return h.unclaimed(ctx, m, msg, now, err)
	}
	if rec.HookPending {
		// Requeued while the hook of its last failure was still due (the
		// worker that failed it died before the hook, and the requeue
		// came before the message that would have run it): that failure's
		// hook runs now, shown the record as it failed, before this run.
		// A worker that holds its lease (running it, or killed in it) is
		// waited for: the run is deferred, no attempt spent, until the
		// lease ends, and then takes the hook over if it is still due
		// (10k soak, seed 1796411833611391690: the run went on, the
		// mark stayed for the next failure, and one hook was lost).
		failed := rec
		failed.State = ledger.Failed
		if held, ok := h.takeOverHook(ctx, failed); !ok {
			at := now.Add(minConcurrencyBackoff) // the claim of the hook failed: soon
			if held > 0 {
				at = ledger.Millis(held + 1)
			}
			return h.finish(ctx, rec, ledger.Finish{State: ledger.Scheduled, RunAt: at, Deferred: true}, nil)
		}
		rec.HookPending = false // it ran: this run's failure, if any, has its own
	}
	// Every claimed job gets its consumer span, with a worker or not.
	if h.o.TracerProvider != nil {
		var span trace.Span
		ctx, span = h.tracer.Start(ctx, enqueue.SpanName("process", h.queueURL), trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(append(enqueue.ConsumerSpanAttributes(h.queueURL, m.MessageId),
				attribute.String("nexjob.job_id", rec.ID), attribute.String("nexjob.kind", rec.Kind), attribute.Int("nexjob.attempt", rec.Attempt))...))
		defer span.End()
	}
	// Never started: the first attempt, and no run of it began before (a
	// cut-off run started, in time, and got its attempt back; a run that
	// slept or waited did too: Record.Ran).
	if rec.Attempt == 1 && rec.Deadline != 0 && now.UnixMilli() > rec.Deadline && !rec.Ran() {
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Expired, LastError: "deadline passed before the job started"}, nil)
	}
	if rec.Kind != msg.Kind {
		// Not a message the system made (every message names its job's
		// kind): its kind chose this claim's lease and timeout. The claim
		// is given back, no attempt spent, and the job's own message is
		// sent; the run goes by the record alone.
		h.log.WarnContext(ctx, "nexjob: message names another kind than its job's; the claim is given back", "job_id", rec.ID, "kind", rec.Kind)
		return h.finish(ctx, rec, ledger.Finish{State: ledger.Scheduled, RunAt: now, Deferred: true}, nil)
	}
	if !known {
		// A producer deployed before its worker, most likely: retry, so
		// the job runs once the worker is deployed.
		err := fmt.Errorf("%w: %q", ErrUnknownKind, rec.Kind)
		h.log.ErrorContext(ctx, "nexjob: no worker for the job's kind", "job_id", rec.ID, "kind", rec.Kind, "attempt", rec.Attempt)
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.RecordError(err)
			span.SetStatus(codes.Error, "no worker for the kind")
		}
		return h.failed(ctx, rec, err, h.o.UnknownKindBackoff)
	}
	adm, err := h.admit(ctx, e, rec)
	if err != nil {
		// A flow-control key function panicked: user code, failed as a
		// worker's panic is (the attempt is spent).
		h.log.ErrorContext(ctx, "nexjob: flow-control key function failed", "job_id", rec.ID, "kind", rec.Kind, "err", err)
		return h.failed(ctx, rec, err, h.backoffOf(e))
	}
	if !adm.deferTo.IsZero() {
		// Flow control: no slot now. Not a run: the attempt is given back.
		done := h.finish(ctx, rec, ledger.Finish{State: ledger.Scheduled, RunAt: adm.deferTo, Deferred: true, Slot: adm.slot, Ticket: adm.ticket}, nil)
		if done && adm.waiter != nil {
			adm.waiter()
		}
		return done
	}
	defer adm.release() // after the run's end is recorded, whatever it was
	return h.run(ctx, e, rec, deadline, cause)
}

// claimContext is ctx for a claim: it ends finishMargin before ctx's
// deadline when that leaves the claim as long again, so that a claim
// still unanswered then (a backend slowed down under load: the 10k soak,
// seed 1796529837542061033, saw batches of ten claims cut at once when
// the invocation gave up) leaves time to give it back (giveBack).
func claimContext(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok || time.Until(dl) < 2*finishMargin {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, dl.Add(-finishMargin))
}

// giveBack undoes a claim whose outcome is unknown (see ledger.Unclaim):
// a claim that landed with no run to follow it spent an attempt for
// nothing, and a job whose claims kept landing after their invocations
// gave up was failed as an orphan out of attempts without ever starting
// (the 10k soak, seed 1796529837542061033: a recurring firing's job and a
// requeued one). Best effort: a give-back that fails leaves the claim to
// its lease, as before.
func (h *Handler) giveBack(ctx context.Context, id string, err error) {
	var uo *ledger.UnknownOutcomeError
	if !errors.As(err, &uo) || uo.Nonce == "" || ctx.Err() != nil {
		return
	}
	back, gerr := h.store.Unclaim(ctx, id, uo.Nonce)
	switch {
	case gerr != nil:
		h.log.WarnContext(ctx, "nexjob: giving back a claim of unknown outcome failed; its lease decides", "job_id", id, "err", gerr)
	case back:
		h.log.InfoContext(ctx, "nexjob: claim of unknown outcome given back; no attempt spent", "job_id", id)
	}
}

// unclaimed handles a message whose claim failed and reports whether it
// may be deleted.
func (h *Handler) unclaimed(ctx context.Context, m events.SQSMessage, msg enqueue.Message, now time.Time, err error) bool {
	var nc *ledger.NotClaimableError
	switch {
	case errors.As(err, &nc):
		return h.notClaimable(ctx, m, msg, nc.Current, now)
	case errors.Is(err, ledger.ErrNotFound):
		h.log.WarnContext(ctx, "nexjob: message for a job that is gone", "job_id", msg.ID, "kind", msg.Kind)
		return true
	case errors.Is(err, ledger.ErrBadID):
		return h.notAJob(ctx, m, err)
	}
	h.log.ErrorContext(ctx, "nexjob: claim failed", "job_id", msg.ID, "err", err)
	return false
}

// stillWaiting answers a dispatch guard's check: run tells whether the
// check message goes on to the claim. It does for a job waiting past its
// run time and never started (first: its claim marks the record
// ByCheck), and for a job that a check started before (ByCheck): that
// message is the job's only one, back after a retry whose send failed, a
// worker killed mid-run or between its result's write and the send, and it
// is handled as the job's own from then on (10k soaks, seeds
// 1796411833611391690 and 1796415236576371073: the check was deleted, and
// the job stayed Scheduled, or Processing, for good). One eventually
// consistent read; a stale answer costs at most a refused claim. A job
// that is gone is no error: there is nothing to run.
//
// A job never started and not yet due gives later, the unix-ms time the
// check is due again (GuardAfter past its run time): its run moved later
// after the guard sent the check (a debounce fold), and the check may be
// all that names it (its producer died before the send), so it must not
// vanish. Its own message, if any, runs it first and the check is
// dropped then.
func (h *Handler) stillWaiting(ctx context.Context, msg enqueue.Message, now time.Time) (run, first bool, later int64, err error) {
	rec, err := h.store.Peek(ctx, msg.ID)
	if errors.Is(err, ledger.ErrNotFound) || errors.Is(err, ledger.ErrBadID) {
		return false, false, 0, nil
	}
	if err != nil {
		return false, false, 0, err
	}
	waiting := rec.State == ledger.Enqueued || rec.State == ledger.Scheduled && rec.RunAt <= now.UnixMilli()
	switch {
	case rec.ByCheck:
		return true, false, 0, nil
	case waiting && rec.Attempt == 0:
		h.log.WarnContext(ctx, "nexjob: job was never sent; the guard's check runs it", "job_id", rec.ID, "kind", rec.Kind)
		return true, true, 0, nil
	case rec.State == ledger.Scheduled && rec.Attempt == 0:
		return false, false, rec.RunAt + h.o.GuardAfter.Milliseconds(), nil
	}
	return false, false, 0, nil
}

// notClaimable decides the fate of a message whose job may not run now.
func (h *Handler) notClaimable(ctx context.Context, m events.SQSMessage, msg enqueue.Message, cur ledger.Record, now time.Time) bool {
	if cur.State == ledger.Failed && cur.HookPending {
		// The worker that failed it died before its hook returned, or is
		// running it now: then look again when its lease on the hook ends.
		if held, ok := h.takeOverHook(ctx, cur); !ok {
			return held > 0 && h.comeBackAt(ctx, m, msg, held, now)
		}
	}
	switch {
	case cur.State.Terminal() && len(cur.Children) > 0:
		// A replay after a crash between the parent's end and its
		// children's release or ending, or the message that hands a
		// parent's ending down to the continuations of the child it
		// ended (CancelContinuations): again (idempotent).
		return h.settleChildren(ctx, cur)
	case cur.State.Terminal() && (cur.Caller != "" || cur.Cancelled):
		// A child tells its caller it ended, a cancelled job takes its
		// children with it: again, after a failure (both idempotent).
		return h.childFollowUps(ctx, cur)
	case cur.State.Terminal() || cur.State == ledger.AwaitingContinuation:
		return true // a duplicate delivery, or the parent will dispatch it
	case cur.State == ledger.Scheduled && cur.RunAt > now.UnixMilli() && h.store.Signalled(cur):
		return h.wakeSignalled(ctx, cur) // asleep in a wait its signal reached: now
	case cur.State == ledger.Scheduled && cur.RunAt > now.UnixMilli() && cur.AwaitEnd == cur.RunAt:
		// Asleep in a wait for children, met by a due message: the run
		// that began the wait could not look for a child's end that came
		// meanwhile (childrenEndedMeanwhile failed), or a duplicate. The
		// job runs now and looks: at worst one replay more.
		return h.wakeSignalled(ctx, cur)
	case cur.State == ledger.Scheduled && cur.RunAt > now.UnixMilli():
		msg.RunAt = cur.RunAt
		return h.carryForward(ctx, msg, now)
	case cur.State == ledger.Processing && cur.LeaseUntil > now.UnixMilli():
		// Running elsewhere: look again when the lease ends.
		return h.comeBackAt(ctx, m, msg, cur.LeaseUntil, now)
	case cur.Attempt >= cur.MaxAttempts:
		// The last attempt's worker died (a live lease returned above): an
		// orphan out of attempts.
		cause := fmt.Errorf("%w; no attempts are left", ErrOrphaned)
		h.log.WarnContext(ctx, "nexjob: orphaned job out of attempts; failing it", "job_id", cur.ID, "kind", cur.Kind, "attempt", cur.Attempt)
		return h.finish(ctx, cur, ledger.Finish{State: ledger.Failed, LastError: cause.Error()}, cause)
	}
	h.log.WarnContext(ctx, "nexjob: job not claimable", "job_id", cur.ID, "state", cur.State)
	return false
}

// comeBackAt has m come back just after the unix-ms time at, and
// reports whether m may be deleted. From a queue the worker knows, m is
// made visible again then (kept: false); a failure only leaves the
// queue's own visibility timeout. From one it does not (see sourceQueue:
// a queue taken out of NEXJOB_QUEUES whose event source outlived it), its
// body (msg) is sent on via the job queue, due then, and m is deleted: a
// queue on its way out keeps nothing the job needs (and its receipt
// handle is no good on the job queue's URL). A failed send keeps m.
func (h *Handler) comeBackAt(ctx context.Context, m events.SQSMessage, msg enqueue.Message, at int64, now time.Time) bool {
	if _, url, known := h.sourceQueue(m); known {
		secs := int32(ledger.Millis(at).Sub(now)/time.Second) + 1
		_, err := h.sqs.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(url), ReceiptHandle: aws.String(m.ReceiptHandle), VisibilityTimeout: min(max(secs, 0), 43200),
		})
		if err != nil {
			h.log.WarnContext(ctx, "nexjob: change visibility failed", "job_id", msg.ID, "err", err)
		}
		return false
	}
	msg.RunAt, msg.Queue = at+1, ""
	if err := h.producer.Send(ctx, msg, ledger.Millis(msg.RunAt).Sub(now)); err != nil {
		h.log.ErrorContext(ctx, "nexjob: sending on a message from a queue not configured failed; it comes back", "job_id", msg.ID, "err", err)
		return false
	}
	return true
}

// receivedOn is the name of the queue m came from (see sourceQueue),
// with a warning when the worker does not know that queue.
func (h *Handler) receivedOn(ctx context.Context, m events.SQSMessage, id string) string {
	name, _, known := h.sourceQueue(m)
	if !known {
		h.log.WarnContext(ctx, "nexjob: message from a queue not configured (NEXJOB_QUEUES); handled as the job queue's", "job_id", id, "source", m.EventSourceARN)
	}
	return name
}

// sourceQueue is the queue m was received from, by name ("" the job
// queue) and URL: the queue its receipt handle belongs to, and the one a
// message sent on goes back to. It is matched by the event's source ARN
// (the queue's name is its last field) or, from the local poller, its URL;
// none (a hand-made event) is the job queue. A source matching none of
// the worker's queues (known false: a named queue taken out of
// NEXJOB_QUEUES whose event source outlived it) is taken as the job queue
// too, so what is sent on goes there. Never the body's "queue" field:
// anyone who can send to a queue can write that (a body naming an
// unknown queue made its carry fail until the DLQ consumer ended the job
// as never started).
func (h *Handler) sourceQueue(m events.SQSMessage) (name, url string, known bool) {
	src := m.EventSourceARN
	last := src[strings.LastIndexByte(src, ':')+1:]
	same := func(u string) bool { return u == src || u[strings.LastIndexByte(u, '/')+1:] == last }
	if src == "" || same(h.queueURL) {
		return "", h.queueURL, true
	}
	for n, u := range h.o.Queues {
		if same(u) {
			return n, u, true
		}
	}
	return "", h.queueURL, false
}

// notAJob keeps a message that is not a job: in the DLQ with the reason
// when one is configured, else back to SQS for the redrive policy.
func (h *Handler) notAJob(ctx context.Context, m events.SQSMessage, why error) bool {
	h.log.ErrorContext(ctx, "nexjob: message is not a job", "message_id", m.MessageId, "err", why)
	if h.o.DLQURL == "" {
		return false
	}
	_, err := h.sqs.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl:    aws.String(h.o.DLQURL),
		MessageBody: aws.String(m.Body),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			"nexjob-reason":     {DataType: aws.String("String"), StringValue: aws.String(why.Error())},
			"nexjob-message-id": {DataType: aws.String("String"), StringValue: aws.String(m.MessageId)},
		},
	})
	if err != nil {
		h.log.ErrorContext(ctx, "nexjob: could not move the message to the DLQ", "message_id", m.MessageId, "err", err)
		return false
	}
	return true
}
