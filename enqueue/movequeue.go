package enqueue

import (
	"context"
	"fmt"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// MoveQueue moves the job jobID off the named queue from onto to ("" the
// job queue, else one of ClientOptions.Queues). It is the way out for a
// named queue taken out of NEXJOB_QUEUES while jobs waited on it: their
// messages went with the queue (or sit where no worker reads them), and
// their records still name it. The ledger decides, from one consistent
// read:
//
//   - a job waiting on from (Enqueued, or Scheduled: a far one's one-time
//     schedule is retargeted) is sent to to, then its record moved by one
//     conditional write on its state and fencing token (ledger's
//     MoveQueue);
//   - a job whose run's lease ran out with no end recorded (Processing:
//     its worker died, its message on from) is sent and moved the same
//     way, and a worker takes it over as any orphan;
//   - a continuation still waiting for its parents is moved and not sent:
//     its release sends it to its queue.
//
// Sent before the write: a crash between the two leaves the job on from
// with a message on to, which runs it (the claim decides), and running
// the move again moves it. A claim or an end that lands between the read
// and the write (a worker reading the message on to, or an old one on
// from) refuses the write, and the job is decided again as it is then: a
// run is never touched, and the job runs once whichever of its messages
// comes first (the others find it claimed or ended).
//
// How it fails: to not among the client's Queues is an *InputError
// matching ErrUnknownQueue; from "" or equal to to, an *InputError;
// nothing is read then. A job not on from (moved already, or never
// there), ended, or running under a live lease is a *NotMovedError,
// nothing written. A failed send is a *DispatchError, nothing written
// (move it again). A job that is gone is ledger.ErrNotFound; one that
// kept changing under three tries, ledger.ErrContention.
func (c *Client) MoveQueue(ctx context.Context, jobID, from, to string) (ledger.Record, error) {
	if err := c.CheckMove(from, to); err != nil {
		return ledger.Record{}, err
	}
	cur, err := c.store.Get(ctx, jobID)
	if err != nil {
		return ledger.Record{}, c.missing(err)
	}
	for range 3 {
		if err := movable(cur, from, c.store.Now()); err != nil {
			return cur, err
		}
		if cur.State != ledger.AwaitingContinuation {
			moved := cur
			moved.Queue = to
			if err := c.Dispatch(ctx, moved); err != nil {
				return cur, &DispatchError{JobID: cur.ID, Err: c.missing(err)}
			}
		}
		out, ok, err := c.store.MoveQueue(ctx, cur, to)
		if err != nil {
			return cur, c.missing(err)
		}
		if ok {
			c.log.InfoContext(ctx, "nexjob: moved to another queue", "job_id", out.ID, "from", from, "to", to, "state", out.State)
			return out, nil
		}
		cur = out // it moved on meanwhile: decide again
	}
	return cur, ledger.ErrContention
}

// CheckMove is MoveQueue's check of its queues: from a named queue, to
// another one the client knows ("" the job queue).
func (c *Client) CheckMove(from, to string) error {
	if from == "" {
		return invalid("from", "name the named queue whose jobs move (the job queue's stay)")
	}
	if from == to {
		return invalid("to", fmt.Sprintf("the jobs are on %q already", from))
	}
	if _, err := c.QueueURL(to); err != nil {
		return &InputError{Field: "to", Reason: fmt.Sprintf("no queue named %q among ClientOptions.Queues", to), Err: err}
	}
	return nil
}

// movable is nil when MoveQueue moves cur off from at now, else why not.
func movable(cur ledger.Record, from string, now time.Time) error {
	why := ""
	switch {
	case cur.Queue != from:
		why = "not on it"
	case cur.State.Terminal():
		why = "ended"
	case cur.State == ledger.Processing && cur.LeaseUntil > now.UnixMilli():
		why = "running"
	}
	if why == "" {
		return nil
	}
	return &NotMovedError{JobID: cur.ID, From: from, Queue: cur.Queue, State: cur.State, Why: why}
}

// NotMovedError: MoveQueue of a job it leaves as it is, nothing written.
// Why is "not on it" (the job is on Queue: moved already, or never on
// From), "ended" (nothing waits to run) or "running" (under a live lease:
// its run's end sends what follows to its queue, via the job queue while
// that queue is not configured; move it again after, if it waits).
type NotMovedError struct {
	JobID, From, Queue string
	State              ledger.State
	Why                string
}

// Reason says why, for people: "running under a live lease: left to
// its run", "ended Succeeded", "on the job queue now".
func (e *NotMovedError) Reason() string {
	switch e.Why {
	case "running":
		return "running under a live lease: left to its run"
	case "ended":
		return "ended " + string(e.State)
	}
	if e.Queue == "" {
		return "on the job queue now"
	}
	return fmt.Sprintf("on queue %q now", e.Queue)
}

func (e *NotMovedError) Error() string {
	return fmt.Sprintf("nexjob: job %s not moved off queue %q: %s", e.JobID, e.From, e.Reason())
}
