package provision_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestLocalStackInitHook runs localstack/ready.d/10-nexjob.sh against the
// backend under test, with `awslocal` played by the AWS CLI pointed at it,
// and checks the table and queues it makes: the hook users get with
// `make up` is exercised here without Docker.
func TestLocalStackInitHook(t *testing.T) {
	cfg := awstest.Config(t)
	cli := os.Getenv("NEXJOB_AWS_CLI")
	if cli == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("NEXJOB_AWS_CLI is not set: run through make test")
		}
		t.Skip("NEXJOB_AWS_CLI is not set: run through make test, which installs the AWS CLI")
	}
	shim := t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\nexec %q --endpoint-url \"$AWS_ENDPOINT_URL\" \"$@\"\n", cli)
	if err := os.WriteFile(filepath.Join(shim, "awslocal"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("hook-%d", time.Now().UnixNano()%1e9)
	cmd := exec.Command("bash", "../localstack/ready.d/10-nexjob.sh")
	cmd.Env = append(os.Environ(), "PATH="+shim+":"+os.Getenv("PATH"), "NEXJOB_NAME="+name, "AWS_DEFAULT_REGION="+cfg.Region)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hook: %v\n%s", err, out)
	}
	ctx := context.Background()
	db, q := dynamodb.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	t.Cleanup(func() {
		_, _ = db.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
	})
	tbl, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	if tbl.Table.StreamSpecification == nil || len(tbl.Table.GlobalSecondaryIndexes) != 1 ||
		aws.ToString(tbl.Table.GlobalSecondaryIndexes[0].IndexName) != ledger.IndexByState {
		t.Fatalf("table: %+v", tbl.Table)
	}
	ttl, err := db.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(name)})
	if err != nil || ttl.TimeToLiveDescription.TimeToLiveStatus != ddbtypes.TimeToLiveStatusEnabled ||
		aws.ToString(ttl.TimeToLiveDescription.AttributeName) != ledger.TTLAttribute {
		t.Fatalf("TTL: %+v %v", ttl, err)
	}
	url, err := q.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	attrs, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: url.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
	if err != nil {
		t.Fatal(err)
	}
	if rp := attrs.Attributes["RedrivePolicy"]; !strings.Contains(rp, name+"-dlq") || !strings.Contains(rp, "maxReceiveCount") || attrs.Attributes["VisibilityTimeout"] != "180" {
		t.Fatalf("queue attributes: %v", attrs.Attributes)
	}
}
