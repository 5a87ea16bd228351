package nexjobtest

import (
	"context"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
)

// SQS delivers at least once, and so does the SDK's retryer: a send whose
// reply was lost (a 5xx, a connection dropped by a loaded emulator) is sent
// again and may leave one more message than was asked for. A test that
// counts messages tells such an extra message from a duplicate of ours by
// the resends it saw: every config Config returns records, per queue URL,
// the messages the SDK sent more than once.

var resent = struct {
	sync.Mutex
	byQueue map[string]int
}{byQueue: map[string]int{}}

type sendKey struct{}

// send is one SendMessage or SendMessageBatch call on its way: its queue,
// its messages and its HTTP attempts so far.
type send struct {
	queue    string
	messages int
	attempts int
}

// trackResends installs the resend record on cfg.
func trackResends(cfg *aws.Config) {
	cfg.APIOptions = append(cfg.APIOptions, func(s *middleware.Stack) error {
		if err := s.Initialize.Add(middleware.InitializeMiddlewareFunc("nexjobtestSend",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				switch p := in.Parameters.(type) {
				case *sqs.SendMessageInput:
					ctx = context.WithValue(ctx, sendKey{}, &send{queue: aws.ToString(p.QueueUrl), messages: 1})
				case *sqs.SendMessageBatchInput:
					ctx = context.WithValue(ctx, sendKey{}, &send{queue: aws.ToString(p.QueueUrl), messages: len(p.Entries)})
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.After); err != nil {
			return err
		}
		// After the retryer: once per HTTP attempt.
		return s.Finalize.Insert(middleware.FinalizeMiddlewareFunc("nexjobtestAttempt",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				if sd, ok := ctx.Value(sendKey{}).(*send); ok {
					sd.attempts++
					if sd.attempts > 1 {
						resent.Lock()
						resent.byQueue[sd.queue] += sd.messages
						resent.Unlock()
					}
				}
				return next.HandleFinalize(ctx, in)
			}), "Retry", middleware.After)
	})
}

// Resent returns how many messages the SDK sent to the queue more than
// once, through any config of the test kit (an attempt after a 5xx or a
// dropped connection): each may have left an extra message on the queue,
// as SQS's at-least-once delivery allows.
func (e *Env) Resent(queueURL string) int {
	resent.Lock()
	defer resent.Unlock()
	return resent.byQueue[queueURL]
}

// WantDepth fails t unless the queue holds want messages (QueueDepth), or
// more by no more than the messages the SDK resent to it: an extra message
// a resend left is SQS's at-least-once, not a send of the code under test.
func (e *Env) WantDepth(t testing.TB, queueURL string, want int, why string) {
	t.Helper()
	if n := e.QueueDepth(t, queueURL); n < want || n > want+e.Resent(queueURL) {
		t.Fatalf("%s: %d messages, want %d (the SDK resent %d)", why, n, want, e.Resent(queueURL))
	}
}
