//go:build unix

package nexjobtest_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// TestSharedEmulatorIsFoundByTheNext (issue 41 item 2): the first test
// binary starts the shared emulator, the next finds the same one (one
// start for a module's packages), it answers the AWS protocol, and Stop
// leaves it for the others (it ends itself when idle).
func TestSharedEmulatorIsFoundByTheNext(t *testing.T) {
	first, err := nexjobtest.SharedEmulator()
	if err != nil {
		t.Fatal(err)
	}
	first.Stop() // a binary ending: the emulator stays
	next, err := nexjobtest.SharedEmulator()
	if err != nil {
		t.Fatal(err)
	}
	if next.URL != first.URL {
		t.Fatalf("the next binary started another emulator (%s, then %s)", first.URL, next.URL)
	}
	cfg := aws.Config{Region: "us-east-1", BaseEndpoint: aws.String(next.URL), Credentials: aws.AnonymousCredentials{}}
	q := sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.Credentials = staticCreds{} })
	out, err := q.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String("nj-shared-" + t.Name())})
	if err != nil || out.QueueUrl == nil {
		t.Fatalf("the shared emulator does not answer SQS: %v", err)
	}
	_, _ = q.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
}

type staticCreds struct{}

func (staticCreds) Retrieve(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
}
