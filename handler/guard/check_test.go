package guard_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

// TestCheckSkipsJobsClaimedInTheBatch (issue 12, the guard's cost): a job
// inserted and claimed in the same stream batch gets no check message; a
// job claimed and then requeued in one batch, or never claimed, gets one.
func TestCheckSkipsJobsClaimedInTheBatch(t *testing.T) {
	e := nexjobtest.New(t, nil)
	// Checks due at once (MaxDelay 1 ns rounds up to SQS's 1 s delay).
	g := guard.New(e.SQS, e.QueueURL, &guard.Options{MaxDelay: 1})
	changes := []guard.Change{
		{ID: "claimed", Kind: "k", State: ledger.Enqueued},
		{ID: "requeued", Kind: "k", State: ledger.Processing, OldState: ledger.Enqueued, Attempt: 1},
		{ID: "claimed", Kind: "k", State: ledger.Processing, OldState: ledger.Enqueued, Attempt: 1},
		{ID: "requeued", Kind: "k", State: ledger.Enqueued, OldState: ledger.Failed},
		{ID: "waiting", Kind: "k", State: ledger.Scheduled, RunAt: 1},
	}
	if err := g.Check(context.Background(), changes); err != nil {
		t.Fatal(err)
	}
	n := e.QueueDepth(t, e.QueueURL) // visible, in flight and delayed
	var got []sqstypes.Message
	for end := time.Now().Add(time.Minute); len(got) < n && time.Now().Before(end); {
		got = append(got, e.Messages(t, e.QueueURL)...) // the delayed ones turn visible within a second
		if len(got) < n {
			time.Sleep(100 * time.Millisecond)
		}
	}
	var ids []string
	for _, m := range got {
		msg, err := enqueue.DecodeMessage(aws.ToString(m.Body))
		if err != nil || !msg.Check {
			t.Fatalf("%q: %v", aws.ToString(m.Body), err)
		}
		ids = append(ids, msg.ID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"requeued", "waiting"}) {
		t.Fatalf("checks sent for %v; want requeued and waiting only", ids)
	}
}
