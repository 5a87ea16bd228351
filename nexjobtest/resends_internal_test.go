package nexjobtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/internal/proof/faults"
)

// fatalTB records a Fatalf instead of ending the test.
type fatalTB struct {
	testing.TB
	failed string
}

func (f *fatalTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }
func (f *fatalTB) Helper()                           {}

// A send the SDK sent twice (its first reply lost after SQS took it) is a
// resend of that queue, and WantDepth reads its extra message as SQS's; a
// message no resend explains still fails it.
func TestResentCountsTheSDKsSecondAttempts(t *testing.T) {
	t.Parallel()
	e := New(t, nil)
	ctx := context.Background()
	ft := faults.New(nil)
	c := sqs.NewFromConfig(faults.Config(e.Cfg, ft))
	send := func() {
		t.Helper()
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(e.QueueURL), MessageBody: aws.String("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	send()
	if n := e.Resent(e.QueueURL); n != 0 {
		t.Fatalf("after a send answered at once: %d resent, want 0", n)
	}
	lost := ft.Add(faults.Rule{Op: "SQS.SendMessage", Fault: faults.LostReply})
	send()
	if lost.Fired() != 1 || e.QueueDepth(t, e.QueueURL) != 3 || e.Resent(e.QueueURL) != 1 {
		t.Fatalf("a send whose reply was lost: fired %d, %d messages, %d resent; want 1, 3 (one extra), 1",
			lost.Fired(), e.QueueDepth(t, e.QueueURL), e.Resent(e.QueueURL))
	}
	ok := &fatalTB{TB: t}
	e.WantDepth(ok, e.QueueURL, 2, "two sends, one resent")
	if ok.failed != "" {
		t.Fatalf("the resend's extra message failed WantDepth: %s", ok.failed)
	}
	for _, want := range []int{1, 4} { // one message too many that no resend explains; one too few
		bad := &fatalTB{TB: t}
		e.WantDepth(bad, e.QueueURL, want, "wrong count")
		if bad.failed == "" {
			t.Fatalf("WantDepth(%d) passed with 3 messages and 1 resent", want)
		}
	}
}
