// Package awstest gives tests isolated AWS resources on a real backend: the
// default emulator that `make test` starts, LocalStack, or real AWS, chosen
// by the standard SDK environment (AWS_ENDPOINT_URL, region, credentials).
//
// It builds on the public test kit, nexjobtest, adding what only this
// project's own tests need (fault injection, raw scans, request counts).
// With no backend configured a test is skipped with the reason, except
// under CI=true, where it fails: a CI run that skipped every test must not
// look green.
package awstest

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"

	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/provision"
)

// Config loads the SDK configuration of the backend under test.
func Config(t testing.TB) aws.Config { return nexjobtest.Config(t) }

// Env is one test's own table and queues (the public test kit's), with
// what only this project's tests need.
type Env struct {
	*nexjobtest.Env
}

// QueueOptions tune the test's queue; zero values take provision's defaults.
type QueueOptions = provision.QueueSpec

// New creates a table and queues named after the test and removes them when
// it ends.
func New(t testing.TB, qopts *QueueOptions) *Env {
	t.Helper()
	var o nexjobtest.Options
	if qopts != nil {
		o.Queue = *qopts
	}
	return &Env{Env: nexjobtest.New(t, &o)}
}

// Faulty returns a fault-injecting transport and a config whose clients
// go through it to this Env's backend, with the SDK's standard retryer (see
// faults.Config).
func (e *Env) Faulty() (*faults.Transport, aws.Config) {
	ft := faults.New(nil)
	return ft, faults.Config(e.Cfg, ft)
}

// Records returns every item of the table, decoded, including archived and
// expired ones: what is really stored.
func (e *Env) Records(t testing.TB) []ledger.Record { return e.Scan(t) }

// Purge receives and deletes every visible message of the queue.
func (e *Env) Purge(t testing.TB, queueURL string) {
	t.Helper()
	for _, m := range e.Messages(t, queueURL) {
		if _, err := e.SQS.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
			t.Fatalf("delete: %v", err)
		}
	}
}

// Counter records the AWS requests our code makes through a config, one
// per operation call (not per HTTP attempt: a retry the SDK makes on a
// loaded machine is not a request of ours, and counting it made cost
// tests fail by luck), as "Service.Operation".
type Counter struct {
	mu    sync.Mutex
	calls []string
}

// Count installs a Counter on cfg; clients built from cfg afterwards report
// to it.
func Count(cfg *aws.Config) *Counter {
	c := &Counter{}
	c.On(cfg)
	return c
}

// On installs c on another config too: clients built from it report to c
// as well.
func (c *Counter) On(cfg *aws.Config) {
	cfg.APIOptions = append(cfg.APIOptions, func(s *middleware.Stack) error {
		return s.Initialize.Add(middleware.InitializeMiddlewareFunc("nexjobCount",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				c.mu.Lock()
				c.calls = append(c.calls, awsmiddleware.GetServiceID(ctx)+"."+awsmiddleware.GetOperationName(ctx))
				c.mu.Unlock()
				return next.HandleInitialize(ctx, in)
			}), middleware.After)
	})
}

// Calls returns the requests so far.
func (c *Counter) Calls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls...)
}

// Reset forgets the requests so far.
func (c *Counter) Reset() {
	c.mu.Lock()
	c.calls = nil
	c.mu.Unlock()
}

// ItemSize is an item's size as DynamoDB bills it: each attribute's name
// plus its value (strings and numbers by their bytes, maps and lists by
// their members plus 3 bytes, booleans 1). A write costs a write unit per
// started KB of it (of the larger of before and after, for an update);
// tests count units with it.
func ItemSize(item map[string]types.AttributeValue) int {
	n := 0
	for k, v := range item {
		n += len(k) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return len(v.Value)
	case *types.AttributeValueMemberBOOL:
		return 1
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberSS:
		n := 0
		for _, s := range v.Value {
			n += len(s)
		}
		return n
	case *types.AttributeValueMemberM:
		return 3 + ItemSize(v.Value)
	case *types.AttributeValueMemberL:
		n := 3
		for _, x := range v.Value {
			n += 1 + valueSize(x)
		}
		return n
	}
	return 0
}

// Buffer is a bytes.Buffer safe for concurrent writers: a log or metrics
// sink that a test reads while handlers write.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
