package handler_test

import (
	"bytes"
	"context"
	"runtime"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// sendOf matches an SQS send of job id's message.
func sendOf(id string) func([]byte) bool {
	return func(b []byte) bool { return bytes.Contains(b, []byte(id)) }
}

// TestCascadeSendReplyLost: the sends that hand an ending down the tree
// (the root's continuation's, one level down; the keyed child's, two
// levels down) are applied and their replies lost: the SDK's resends put
// a second message of each on the queue, and the tree still ends once,
// every job unrun.
func TestCascadeSendReplyLost(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, failing, rigConfig{faults: true, queue: fastQueue})
	root := r.enqueue(t, email{To: "fail@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	tr := growTree(t, r, root)
	first := r.ft.Add(faults.Rule{Op: "SQS.SendMessage", Match: sendOf(tr.b), Fault: faults.LostReply})
	second := r.ft.Add(faults.Rule{Op: "SQS.SendMessage", Match: sendOf(tr.keyed), Fault: faults.LostReply})
	r.drain(t)
	fired(t, first, 1)
	fired(t, second, 1)
	tr.endedBelow(t, r, ledger.Failed)
}

// TestCascadeSendThrottledPastTheRetries: the same sends throttled past
// the SDK's retries. The message whose handling made them comes back
// (the root's, then the continuation's), finds its job ended with
// children, and sends again: the whole tree ends.
func TestCascadeSendThrottledPastTheRetries(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, failing, rigConfig{faults: true, queue: fastQueue})
	root := r.enqueue(t, email{To: "fail@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	tr := growTree(t, r, root)
	first := r.ft.Add(faults.Rule{Op: "SQS.SendMessage", Match: sendOf(tr.b), Fault: faults.Throttle, Times: faults.Attempts})
	second := r.ft.Add(faults.Rule{Op: "SQS.SendMessage", Match: sendOf(tr.keyed), Fault: faults.Throttle, Times: faults.Attempts})
	r.drain(t)
	fired(t, first, faults.Attempts)
	fired(t, second, faults.Attempts)
	tr.endedBelow(t, r, ledger.Failed)
}

// TestCascadeResumesAfterAKill: the worker that failed the root is killed
// after it ended the root's continuation and before it handed the ending
// on (its send never made). The root's message comes back, finds the root
// Failed with children, and the ending goes on down the whole tree.
func TestCascadeResumesAfterAKill(t *testing.T) {
	t.Parallel()
	r := newRigWith(t, failing, rigConfig{faults: true, queue: fastQueue})
	root := r.enqueue(t, email{To: "fail@example.com"}, &enqueue.Opts{MaxAttempts: 1})
	tr := growTree(t, r, root)
	killed := make(chan struct{})
	r.ft.Add(faults.Rule{Op: "SQS.SendMessage", Match: sendOf(tr.b), Fault: faults.Throttle, After: func() {
		close(killed)
		runtime.Goexit()
	}})
	// The root's message as its first delivery hands it over (it stays on
	// the queue: this worker dies before deleting it).
	ev := events.SQSEvent{Records: []events.SQSMessage{{MessageId: root, ReceiptHandle: "not-a-receipt", Body: enqueue.Message{V: 1, ID: root, Kind: "email"}.Encode()}}}
	go func() { _, _ = r.h.Handle(context.Background(), ev) }()
	<-killed
	if got := r.get(t, tr.b); got.State != ledger.Failed || r.get(t, tr.keyed).State != ledger.AwaitingContinuation {
		t.Fatalf("at the kill: continuation %s, keyed child %s; want the kill between the two", got.State, r.get(t, tr.keyed).State)
	}
	r.drain(t)
	tr.endedBelow(t, r, ledger.Failed)
}
