package handler_test

import (
	"bytes"
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestDeadLettersStopBeforeTheDeadline: the DLQ consumer takes up no dead
// letter with less than StopBefore (a third of its time, at most) left
// before its invocation's deadline: the rest of the batch comes back,
// untouched, as the worker's Handle leaves its messages. It went on to
// the end, so a batch slowed down by its backend ran its invocation out
// (the soak, seed 20261206: 252 dead letters "not recorded ... GetItem,
// context deadline exceeded" in one run), and one that ran past it
// was ended by Lambda with nothing deleted, the same batch failing
// again at its next delivery.
func TestDeadLettersStopBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, ok, rigConfig{faults: true})
	first := r.enqueue(t, email{To: "first@example.com"}, nil)
	second := r.enqueue(t, email{To: "second@example.com"}, nil)
	msgs := r.receive(t, 2)
	var ev events.SQSEvent
	for _, m := range msgs { // the first job's dead letter first
		if bytes.Contains([]byte(*m.Body), []byte(first)) {
			ev.Records = append([]events.SQSMessage{r.moveToDLQ(t, m)}, ev.Records...)
		} else {
			ev.Records = append(ev.Records, r.moveToDLQ(t, m))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Second) // StopBefore: a third, 3 s
	defer cancel()
	dl, _ := ctx.Deadline()
	// The first dead letter's read is answered with 1.5 s left: the
	// backend is slow.
	r.ft.Add(faults.Rule{Op: "DynamoDB.GetItem", Fault: faults.Pass, Match: func(b []byte) bool { return bytes.Contains(b, []byte(first)) },
		Before: func(req *http.Request, _ []byte) {
			select {
			case <-time.After(time.Until(dl) - 1500*time.Millisecond):
			case <-req.Context().Done():
			}
		}})
	var secondRead atomic.Int32
	r.ft.Add(faults.Rule{Op: "DynamoDB.GetItem", Fault: faults.Pass, Times: faults.Forever, Match: func(b []byte) bool { return bytes.Contains(b, []byte(second)) },
		Before: func(*http.Request, []byte) { secondRead.Add(1) }})
	resp, err := r.h.HandleDeadLetters(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if n := secondRead.Load(); n != 0 {
		t.Errorf("the second dead letter was taken up with less than StopBefore left: its job read %d times", n)
	}
	if len(resp.BatchItemFailures) == 0 || resp.BatchItemFailures[len(resp.BatchItemFailures)-1].ItemIdentifier != ev.Records[1].MessageId {
		t.Errorf("response %+v: want the second dead letter among the failures (it comes back)", resp.BatchItemFailures)
	}
	if rec := r.get(t, second); rec.State != ledger.Enqueued || rec.Returns != 0 {
		t.Errorf("the dead letter left for later: its job %s with %d returns; want it untouched (Enqueued, none)", rec.State, rec.Returns)
	}
}
