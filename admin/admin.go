// Package admin is what an operator does to a deployment's jobs: look at
// them (Find, Get, Holder, Stats, DeadLetters, JobsOnQueue) and act on
// them (Requeue, Cancel, Delete, RequeueAll, Redrive, MoveQueue). The
// nexjob CLI and the web dashboard are two faces of it, so they cannot
// disagree.
//
//	s, _ := settings.Load(ctx, settings.Operator)
//	a, _ := admin.New(s)
//	st, _ := a.Stats(ctx)
//
// # Costs
//
// Find of an indexed state is a Query of the byState index, and Overview
// (and OverviewSince, the dashboard's charts' window) one Scan of that
// index (its entries hold no args); Find of any other
// state, Stats and JobsOnQueue (MoveQueue's listing), a Scan of the whole
// table (billed for every record): an operator's tool, not a hot path. DeadLetters receives up to ten DLQ
// messages with a visibility timeout of 0 (package internal/sqszero: the
// SDK would otherwise send none, and SQS would hide them for the queue's
// own timeout), so a peek changes nothing a consumer sees; each peek
// counts as a receive. IAM: the construct's GrantOperate covers every
// call.
//
// # How it fails
//
// Each action on one job returns the enqueue package's typed errors
// (*enqueue.NotTerminalError, *enqueue.NotCancellableError,
// ledger.ErrNotFound …) and writes nothing when it refuses. RequeueAll,
// Redrive and MoveQueue go on past one job's failure and report each
// one; a crash half-way leaves every job either moved or untouched, never
// lost: a redriven message is deleted from the DLQ only after its job is
// back on the queue, and a moved job's record changes only after its
// message is on its new queue (a crash in between sends it twice, which
// the worker's conditional claim makes harmless).
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/sqszero"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/recurring"
	"github.com/nexjob/nexjob-aws/settings"
)

// Admin acts on one deployment's table and queues. It is safe for
// concurrent use.
type Admin struct {
	schedules recurring.Options
	client    *enqueue.Client
	store     *ledger.Store
	sqs       *sqs.Client
	queueURL  string
	dlqURL    string
	retention handler.Retention
	cfg       aws.Config
	named     map[string]settings.NamedQueue
	withheld  bool // the key secret is withheld (settings.KeySecretWithheld)
}

// ErrKeySecretWithheld: a lookup by idempotency key in a process the
// deployment's key secret is withheld from (a read-only dashboard or
// CLI): a key's hash cannot be made without it, and one made without it
// would say no job holds a key that one does.
var ErrKeySecretWithheld = errors.New("nexjob: looking up a job by its key needs the deployment's key secret, which read-only roles are not given (look it up by id, or as an operator)")

// New returns an Admin for the deployment the settings name (role
// settings.Operator: table and queue required, DLQ optional).
func New(s settings.Settings) (*Admin, error) {
	opts := s.ClientOptions()
	q := sqs.NewFromConfig(s.AWS)
	opts.SQS = q
	c, err := enqueue.New(s.AWS, s.Table, s.QueueURL, opts)
	if err != nil {
		return nil, err
	}
	return &Admin{client: c, store: c.Store(), sqs: q, queueURL: s.QueueURL, dlqURL: s.DLQURL, retention: s.Retention, schedules: s.Schedules, cfg: s.AWS, named: s.Queues, withheld: s.KeySecretWithheld}, nil
}

// ErrNoSchedules: the settings name no schedule group
// (NEXJOB_SCHEDULE_GROUP; the construct's Recurring prop sets it).
var ErrNoSchedules = errors.New("nexjob: no recurring jobs' schedule group configured (NEXJOB_SCHEDULE_GROUP; the construct's Recurring prop sets it)")

// ScheduledJob is a recurring job as operators see it: its schedule and
// its next firing.
type ScheduledJob struct {
	recurring.Schedule
	Next time.Time // zero: disabled, past, or not evaluated (see recurring.Next)
}

// HasNext reports whether a next firing is known.
func (j ScheduledJob) HasNext() bool { return !j.Next.IsZero() }

// Schedules lists the recurring jobs of the group with their next firing
// (one ListSchedules page per 100 and one GetSchedule each).
func (a *Admin) Schedules(ctx context.Context) ([]ScheduledJob, error) {
	if a.schedules.Group == "" {
		return nil, ErrNoSchedules
	}
	list, err := recurring.New(a.cfg, a.schedules).List(ctx)
	if err != nil {
		return nil, err
	}
	now := a.store.Now()
	out := make([]ScheduledJob, 0, len(list))
	for _, s := range list {
		next, _ := s.NextFiring(now) // zero when there is none
		out = append(out, ScheduledJob{Schedule: s, Next: next})
	}
	return out, nil
}

// Table is the ledger table's name.
func (a *Admin) Table() string { return a.store.Table() }

// Store is the ledger store a reads (replay's Read takes it).
func (a *Admin) Store() *ledger.Store { return a.store }

// HasDLQ reports whether the settings name a DLQ (Redrive needs one).
func (a *Admin) HasDLQ() bool { return a.dlqURL != "" }

// Find lists jobs: see ledger.Store.Find.
func (a *Admin) Find(ctx context.Context, f ledger.Filter) ([]ledger.Record, string, error) {
	return a.store.Find(ctx, f)
}

// Get reads one job; ledger.ErrNotFound if there is none.
func (a *Admin) Get(ctx context.Context, id string) (ledger.Record, error) {
	rec, err := a.store.Get(ctx, id)
	if err != nil {
		return rec, err
	}
	return a.store.WithSteps(ctx, rec) // its steps whole: the steps table's too (one Query a MB)
}

// Holder returns the job that holds the idempotency key (looked up by the
// key's hash; the key itself is neither stored nor logged);
// ledger.ErrNotFound if the key is free; ErrKeySecretWithheld in a
// read-only process with no key secret.
func (a *Admin) Holder(ctx context.Context, key string) (ledger.Record, error) {
	if a.withheld {
		return ledger.Record{}, ErrKeySecretWithheld
	}
	return a.store.GetByKey(ctx, key)
}

// Signal sends job id its signal name with a JSON payload (raw, as typed
// by an operator: it must be valid JSON): see enqueue.Client.Signal.
func (a *Admin) Signal(ctx context.Context, id, name, payload string) error {
	if !json.Valid([]byte(payload)) {
		return &enqueue.InputError{Field: "payload", Reason: `is not valid JSON (a string needs its quotes, inside the shell's: nexjob signal JOB_ID shipped '"1Z999"'; a number or an object as it is: 42, '{"n":1}')`}
	}
	return a.client.Signal(ctx, id, name, json.RawMessage(payload))
}

// Requeue runs a terminal job again: see enqueue.Client.Requeue.
func (a *Admin) Requeue(ctx context.Context, id string) (enqueue.Result, error) {
	return a.client.Requeue(ctx, id)
}

// Cancel withdraws a job that has not started, kept for the Failed
// retention: see enqueue.Client.Cancel.
func (a *Admin) Cancel(ctx context.Context, id, reason string) (ledger.Record, error) {
	return a.client.Cancel(ctx, id, reason, a.retention.Failed)
}

// Delete removes a job's record and frees its key, its waiting
// continuations ended first (released if it Succeeded): see
// enqueue.Client.Delete.
func (a *Admin) Delete(ctx context.Context, id string) error {
	return a.client.Delete(ctx, id)
}

// Stats is an overview of the deployment.
type Stats struct {
	// Jobs counts live records per state and kind.
	Jobs map[ledger.State]map[string]int
	// Queued, InFlight and Delayed are the job queue's approximate counts
	// (visible, received and not yet deleted, not yet visible: a delay);
	// DLQ the dead-letter queue's (visible plus in flight), -1 without a
	// DLQ.
	Queued, InFlight, Delayed, DLQ int
	// Queues are the named queues' counts (NEXJOB_QUEUES), by name.
	Queues []QueueStats
	// EndedLastHour are the jobs that ended in the last hour, by state.
	EndedLastHour map[ledger.State]int
	// Ends are the counted jobs that ended in the window asked (the last
	// hour, or OverviewSince's and StatsSince's since), one each.
	Ends []ledger.End
	// OldestDue is when the counted job waiting longest to start became
	// due (zero: none waits): ledger.JobCounts.OldestDue. SQS says how
	// old its oldest message is only to CloudWatch
	// (ApproximateAgeOfOldestMessage), not over its API.
	OldestDue time.Time
	// Counted are the states Jobs and EndedLastHour count: every state
	// (Stats), or the ones the byState index holds (Overview). Another
	// state's count is unknown, not zero.
	Counted []ledger.State
}

// IsCounted reports whether st's jobs were counted.
func (s Stats) IsCounted(st ledger.State) bool { return slices.Contains(s.Counted, st) }

// QueueStats are one named queue's approximate counts, as Stats's own.
type QueueStats struct {
	Name                           string
	Queued, InFlight, Delayed, DLQ int
}

// Total is the number of jobs in state st, over every kind.
func (s Stats) Total(st ledger.State) int {
	n := 0
	for _, c := range s.Jobs[st] {
		n += c
	}
	return n
}

// Stats counts jobs (one Scan of the whole table: billed for every
// record, its args included) and reads the queues' depths.
func (a *Admin) Stats(ctx context.Context) (Stats, error) {
	return a.StatsSince(ctx, time.Time{})
}

// StatsSince is Stats with the jobs ended since since in Stats.Ends
// (zero: the last hour), from the same Scan.
func (a *Admin) StatsSince(ctx context.Context, since time.Time) (Stats, error) {
	from, hour := a.window(since)
	counts, err := a.store.CountJobs(ctx, from)
	if err != nil {
		return Stats{}, err
	}
	return a.stats(ctx, counts, hour)
}

// Overview is Stats read from the byState index instead of the table
// (ledger.Store.CountIndexed: one Scan of the index's entries, which hold
// no args), what the dashboard's overview shows on every load: its read
// units grow with the number of indexed jobs, never with their args. The
// states the index does not hold (Enqueued, Processing and Succeeded,
// unless IndexAllStates) are not counted: Stats.Counted says which are.
func (a *Admin) Overview(ctx context.Context) (Stats, error) {
	return a.OverviewSince(ctx, time.Time{})
}

// OverviewSince is Overview with the jobs ended since since in Stats.Ends
// (zero: the last hour), from the same Scan of the index: what the
// dashboard's charts draw, at no request more.
func (a *Admin) OverviewSince(ctx context.Context, since time.Time) (Stats, error) {
	from, hour := a.window(since)
	counts, err := a.store.CountIndexed(ctx, from)
	if err != nil {
		return Stats{}, err
	}
	return a.stats(ctx, counts, hour)
}

// window is where a count's Ends start (since, or an hour ago when zero
// or later) and the start of the last hour.
func (a *Admin) window(since time.Time) (from, hour time.Time) {
	hour = a.store.Now().Add(-time.Hour)
	if since.IsZero() || since.After(hour) {
		return hour, hour
	}
	return since, hour
}

// stats are counts and the queues' depths; EndedLastHour counts the
// ends at or after hour.
func (a *Admin) stats(ctx context.Context, counts ledger.JobCounts, hour time.Time) (Stats, error) {
	jobs := counts.ByState
	main, err := a.queueStats(ctx, "", a.queueURL, a.dlqURL)
	if err != nil {
		return Stats{}, err
	}
	st := Stats{Jobs: jobs, Queued: main.Queued, InFlight: main.InFlight, Delayed: main.Delayed, DLQ: main.DLQ,
		EndedLastHour: map[ledger.State]int{}, Ends: counts.Ends, Counted: counts.Counted}
	for _, e := range counts.Ends {
		if e.At >= hour.UnixMilli() {
			st.EndedLastHour[e.State]++
		}
	}
	if counts.OldestDue > 0 {
		st.OldestDue = ledger.Millis(counts.OldestDue)
	}
	for _, name := range slices.Sorted(maps.Keys(a.named)) {
		q := a.named[name]
		qs, err := a.queueStats(ctx, name, q.URL, q.DLQURL)
		if err != nil {
			return Stats{}, err
		}
		st.Queues = append(st.Queues, qs)
	}
	return st, nil
}

// queueStats reads one queue's depth and its DLQ's (-1 without one).
func (a *Admin) queueStats(ctx context.Context, name, url, dlqURL string) (QueueStats, error) {
	qs := QueueStats{Name: name, DLQ: -1}
	var err error
	if qs.Queued, qs.InFlight, qs.Delayed, err = a.depth(ctx, url); err != nil {
		return QueueStats{}, err
	}
	if dlqURL != "" {
		v, f, _, err := a.depth(ctx, dlqURL)
		if err != nil {
			return QueueStats{}, err
		}
		qs.DLQ = v + f
	}
	return qs, nil
}

// depth reads a queue's approximate counts, in one GetQueueAttributes.
func (a *Admin) depth(ctx context.Context, url string) (visible, inFlight, delayed int, err error) {
	out, err := a.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{
			sqstypes.QueueAttributeNameApproximateNumberOfMessages,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed,
		},
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("nexjob: read the depth of %s: %w", url, err)
	}
	visible, _ = strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)])
	inFlight, _ = strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	delayed, _ = strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed)])
	return visible, inFlight, delayed, nil
}

// DeadLetter is one message in the DLQ, as DeadLetters shows it.
type DeadLetter struct {
	MessageID string
	Job       enqueue.Message // zero Job.ID: the body is not a job message
	Receives  int             // how often SQS delivered it, on both queues
	SentAt    time.Time       // when it was first sent
	Record    *ledger.Record  // the job's record, if it has one
}

// DeadLetters peeks at up to max (1–10) DLQ messages with their job
// records. The messages stay in the DLQ.
func (a *Admin) DeadLetters(ctx context.Context, max int) ([]DeadLetter, error) {
	if a.dlqURL == "" {
		return nil, ErrNoDLQ
	}
	if max < 1 || max > 10 {
		max = 10
	}
	out, err := a.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(a.dlqURL),
		MaxNumberOfMessages:         int32(max),
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameApproximateReceiveCount, sqstypes.MessageSystemAttributeNameSentTimestamp},
	}, sqszero.Peek)
	if err != nil {
		return nil, fmt.Errorf("nexjob: read the DLQ %s: %w", a.dlqURL, err)
	}
	var dls []DeadLetter
	for _, m := range out.Messages {
		d := DeadLetter{MessageID: aws.ToString(m.MessageId)}
		d.Receives, _ = strconv.Atoi(m.Attributes[string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount)])
		if ms, err := strconv.ParseInt(m.Attributes[string(sqstypes.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
			d.SentAt = time.UnixMilli(ms)
		}
		if job, err := enqueue.DecodeMessage(aws.ToString(m.Body)); err == nil {
			d.Job = job
			if rec, err := a.store.Get(ctx, job.ID); err == nil {
				d.Record = &rec
			}
		}
		dls = append(dls, d)
	}
	return dls, nil
}

// OnQueue is the Admin for the named queue name (NEXJOB_QUEUES): its
// DeadLetters and Redrive read that queue's DLQ (a redriven job goes
// back to its own queue, as every send of it does). "" gives a itself,
// on the job queue's DLQ. A name the settings do not hold is an error
// matching enqueue.ErrUnknownQueue.
func (a *Admin) OnQueue(name string) (*Admin, error) {
	if name == "" {
		return a, nil
	}
	q, ok := a.named[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q is not among NEXJOB_QUEUES", enqueue.ErrUnknownQueue, name)
	}
	b := *a
	b.queueURL, b.dlqURL = q.URL, q.DLQURL
	return &b, nil
}

// ErrNoDLQ: the settings name no dead-letter queue (NEXJOB_DLQ_URL).
var ErrNoDLQ = errors.New("nexjob: no dead-letter queue configured (set NEXJOB_DLQ_URL)")

// Redrive moves the DLQ's messages back into work, telling progress after
// each, until the DLQ reads empty: a job that ended Failed or Expired (the
// DLQ consumer recorded it) is requeued with a fresh attempt budget; a job
// still active has its message sent to the job queue again; a stray copy
// of a job that Succeeded, or that an operator cancelled, is deleted and
// reported as skipped (the DLQ consumer drops those copies too: they are
// never run again); a message that is not a job, or whose job is gone,
// stays in the DLQ and is reported. Each message is deleted from the DLQ
// only once its job is back. Report.Hidden then counts the messages the
// DLQ still holds that this run never saw (in flight elsewhere): a
// redrive that found the queue empty while it is not says so.
func (a *Admin) Redrive(ctx context.Context, progress Progress) (Report, error) {
	if a.dlqURL == "" {
		return Report{}, ErrNoDLQ
	}
	var rep Report
	seen := map[string]bool{}
	for {
		out, err := a.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:            aws.String(a.dlqURL),
			MaxNumberOfMessages: 10,
			VisibilityTimeout:   60, // messages left behind come back a minute later
		})
		if err != nil {
			return rep, fmt.Errorf("nexjob: read the DLQ %s: %w", a.dlqURL, err)
		}
		fresh := 0
		for _, m := range out.Messages {
			if seen[aws.ToString(m.MessageId)] {
				continue
			}
			seen[aws.ToString(m.MessageId)] = true
			fresh++
			o := a.redriveOne(ctx, m)
			rep.Outcomes = append(rep.Outcomes, o)
			if progress != nil {
				progress(len(rep.Outcomes), len(rep.Outcomes))
			}
		}
		if fresh == 0 {
			break
		}
	}
	visible, inFlight, _, err := a.depth(ctx, a.dlqURL)
	if err != nil {
		return rep, err
	}
	left := 0 // what this run saw and did not delete (hidden by it for a minute)
	for _, o := range rep.Outcomes {
		if o.Err != nil {
			left++
		}
	}
	rep.Hidden = max(0, visible+inFlight-left)
	return rep, nil
}

func (a *Admin) redriveOne(ctx context.Context, m sqstypes.Message) Outcome {
	job, err := enqueue.DecodeMessage(aws.ToString(m.Body))
	if err != nil {
		return Outcome{ID: "message " + aws.ToString(m.MessageId), Err: fmt.Errorf("not a job message, left in the DLQ: %w", err)}
	}
	o := Outcome{ID: job.ID}
	rec, err := a.store.Get(ctx, job.ID)
	switch {
	case err != nil:
		o.Err = fmt.Errorf("left in the DLQ: %w", err)
		return o
	case rec.State == ledger.Succeeded || rec.Cancelled:
		o.Skipped = "already " + string(rec.State)
		if rec.Cancelled {
			o.Skipped = "cancelled by an operator"
		}
		o.Skipped += ": a stray copy, deleted from the DLQ and not run again"
	case rec.State.Terminal():
		if _, err := a.client.Requeue(ctx, job.ID); err != nil {
			o.Err = fmt.Errorf("left in the DLQ: %w", err)
			return o
		}
	default:
		if err := a.client.Dispatch(ctx, rec); err != nil {
			o.Err = fmt.Errorf("left in the DLQ: %w", err)
			return o
		}
	}
	if _, err := a.sqs.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(a.dlqURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
		// The job is back; the DLQ copy is redriven again later, harmlessly.
		o.Err = fmt.Errorf("back in work, but its DLQ copy was not deleted: %w", err)
		if o.Skipped != "" {
			o.Err, o.Skipped = fmt.Errorf("%s, but not deleted: %w", o.Skipped, err), ""
		}
	}
	return o
}

// Indexed reports whether Find of state st queries the index (true) or
// scans the table.
func (a *Admin) Indexed(st ledger.State) bool { return a.store.Indexed(st) }
