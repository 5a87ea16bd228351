// Package awstest gives tests isolated AWS resources on a real backend: the
// default emulator that `make test` starts, LocalStack, or real AWS, chosen
// by the standard SDK environment (AWS_ENDPOINT_URL, region, credentials).
//
// With no backend configured a test is skipped with the reason, except
// under CI=true, where it fails: a CI run that skipped every test must not
// look green.
package awstest

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/nexjob/nexjob-aws/internal/faults"
	"github.com/nexjob/nexjob-aws/internal/provision"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Config loads the SDK configuration of the backend under test.
func Config(t testing.TB) aws.Config {
	t.Helper()
	if os.Getenv("AWS_ENDPOINT_URL") == "" && os.Getenv("NEXJOB_REAL_AWS") != "1" {
		msg := "no AWS backend: run through `make test` (starts the default emulator) or set AWS_ENDPOINT_URL / NEXJOB_REAL_AWS=1"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatalf("load AWS config: %v", err)
	}
	return cfg
}

// Env is one test's own table and queues.
type Env struct {
	Cfg      aws.Config
	DB       *dynamodb.Client
	SQS      *sqs.Client
	Table    string
	QueueURL string
	DLQURL   string
}

// QueueOptions tune the test's queue; zero values take provision's defaults.
type QueueOptions = provision.QueueSpec

var nameRE = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// New creates a table and queues named after the test and removes them when
// it ends.
func New(t testing.TB, qopts *QueueOptions) *Env {
	t.Helper()
	cfg := Config(t)
	name := nameRE.ReplaceAllString(t.Name(), "-")
	if len(name) > 50 {
		name = name[:50]
	}
	name = fmt.Sprintf("nj-%s-%d", strings.Trim(name, "-"), time.Now().UnixNano()%1e9)
	e := &Env{Cfg: cfg, DB: dynamodb.NewFromConfig(cfg), SQS: sqs.NewFromConfig(cfg), Table: name}
	ctx := context.Background()
	if err := provision.Table(ctx, e.DB, name); err != nil {
		t.Fatal(err)
	}
	spec := provision.QueueSpec{Name: name}
	if qopts != nil {
		spec = *qopts
		spec.Name = name
	}
	var err error
	if e.QueueURL, e.DLQURL, err = provision.Queues(ctx, e.SQS, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = e.DB.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
		_, _ = e.SQS.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(e.QueueURL)})
		_, _ = e.SQS.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(e.DLQURL)})
	})
	return e
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
func (e *Env) Records(t testing.TB) []ledger.Record {
	t.Helper()
	var out []ledger.Record
	p := dynamodb.NewScanPaginator(e.DB, &dynamodb.ScanInput{TableName: aws.String(e.Table), ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatalf("scan %s: %v", e.Table, err)
		}
		var recs []ledger.Record
		if err := attributevalue.UnmarshalListOfMaps(page.Items, &recs); err != nil {
			t.Fatalf("decode: %v", err)
		}
		out = append(out, recs...)
	}
	return out
}

// Messages receives what is visible on the queue (deleting nothing) until
// an empty receive, and returns the bodies. Messages stay invisible for
// the queue's visibility timeout afterwards.
func (e *Env) Messages(t testing.TB, queueURL string) []sqstypes.Message {
	t.Helper()
	var out []sqstypes.Message
	for {
		r, err := e.SQS.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10, VisibilityTimeout: 60,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		if len(r.Messages) == 0 {
			return out
		}
		out = append(out, r.Messages...)
	}
}

// Purge receives and deletes every visible message of the queue.
func (e *Env) Purge(t testing.TB, queueURL string) {
	t.Helper()
	for _, m := range e.Messages(t, queueURL) {
		if _, err := e.SQS.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
			t.Fatalf("delete: %v", err)
		}
	}
}

// QueueDepth returns the visible + in-flight + delayed message count.
func (e *Env) QueueDepth(t testing.TB, queueURL string) int {
	t.Helper()
	a, err := e.SQS.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(queueURL),
		AttributeNames: []sqstypes.QueueAttributeName{
			sqstypes.QueueAttributeNameApproximateNumberOfMessages,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed,
		},
	})
	if err != nil {
		t.Fatalf("queue attributes: %v", err)
	}
	n := 0
	for _, v := range a.Attributes {
		i, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("queue attribute %q: %v", v, err)
		}
		n += i
	}
	return n
}

// Counter records the AWS requests made through a config, one per HTTP
// attempt, as "Service.Operation".
type Counter struct {
	mu    sync.Mutex
	calls []string
}

// Count installs a Counter on cfg; clients built from cfg afterwards report
// to it.
func Count(cfg *aws.Config) *Counter {
	c := &Counter{}
	cfg.APIOptions = append(cfg.APIOptions, func(s *middleware.Stack) error {
		return s.Finalize.Add(middleware.FinalizeMiddlewareFunc("nexjobCount",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				c.mu.Lock()
				c.calls = append(c.calls, awsmiddleware.GetServiceID(ctx)+"."+awsmiddleware.GetOperationName(ctx))
				c.mu.Unlock()
				return next.HandleFinalize(ctx, in)
			}), middleware.After)
	})
	return c
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
