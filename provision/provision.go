// Package provision creates the ledger table and the job queues through the
// SDK, from the one schema that ledger and enqueue export. It serves local
// emulators and tests; on AWS the CDK construct in infra/ creates the same
// resources.
//
// Every function is idempotent: resources that exist are left as they are.
package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Table creates the ledger table with TTL on, and waits until it is active.
func Table(ctx context.Context, db *dynamodb.Client, name string) error {
	return table(ctx, db, ledger.CreateTableInput(name))
}

// StepsTable creates the steps table (ledger.Options.StepsTable) with TTL
// on, and waits until it is active.
func StepsTable(ctx context.Context, db *dynamodb.Client, name string) error {
	return table(ctx, db, ledger.CreateStepsTableInput(name))
}

func table(ctx context.Context, db *dynamodb.Client, in *dynamodb.CreateTableInput) error {
	name := aws.ToString(in.TableName)
	_, err := db.CreateTable(ctx, in)
	var inUse *ddbtypes.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("provision: create table %s: %w", name, err)
	}
	w := dynamodb.NewTableExistsWaiter(db, func(o *dynamodb.TableExistsWaiterOptions) { o.MinDelay = 100 * time.Millisecond })
	if err := w.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)}, time.Minute); err != nil {
		return fmt.Errorf("provision: wait for table %s: %w", name, err)
	}
	if _, err := db.UpdateTimeToLive(ctx, ledger.UpdateTimeToLiveInput(name)); err != nil {
		return fmt.Errorf("provision: enable TTL on %s: %w", name, err)
	}
	return nil
}

// QueueSpec describes the job queue and its dead-letter queue.
type QueueSpec struct {
	Name              string        // the job queue; the DLQ is Name+"-dlq"
	VisibilityTimeout time.Duration // defaults to 30 s
	MaxReceiveCount   int           // receives before the DLQ; defaults to 5
}

// Queues creates the DLQ and the job queue redriving to it, and returns
// both URLs.
func Queues(ctx context.Context, q *sqs.Client, spec QueueSpec) (queueURL, dlqURL string, err error) {
	if spec.VisibilityTimeout == 0 {
		spec.VisibilityTimeout = 30 * time.Second
	}
	if spec.MaxReceiveCount == 0 {
		spec.MaxReceiveCount = 5
	}
	dlq, err := q.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String(spec.Name + "-dlq"),
		Attributes: map[string]string{"MessageRetentionPeriod": "1209600", "SqsManagedSseEnabled": "true"},
	})
	if err != nil {
		return "", "", fmt.Errorf("provision: create DLQ: %w", err)
	}
	dlqARN, err := QueueARN(ctx, q, aws.ToString(dlq.QueueUrl))
	if err != nil {
		return "", "", fmt.Errorf("provision: DLQ ARN: %w", err)
	}
	redrive := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"%d"}`, dlqARN, spec.MaxReceiveCount)
	main, err := q.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName: aws.String(spec.Name),
		Attributes: map[string]string{
			"VisibilityTimeout":    strconv.Itoa(int(spec.VisibilityTimeout / time.Second)),
			"RedrivePolicy":        redrive,
			"SqsManagedSseEnabled": "true",
		},
	})
	if err != nil {
		return "", "", fmt.Errorf("provision: create queue: %w", err)
	}
	return aws.ToString(main.QueueUrl), aws.ToString(dlq.QueueUrl), nil
}

// QueueARN is the queue's ARN (one GetQueueAttributes).
func QueueARN(ctx context.Context, q *sqs.Client, url string) (string, error) {
	attrs, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return "", err
	}
	return attrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)], nil
}

// TableJSON is ledger.CreateTableInput as the AWS CLI's --cli-input-json
// takes it (nulls dropped): LocalStack's init hook creates the table from it.
func TableJSON(name string) ([]byte, error) {
	return cliJSON(ledger.CreateTableInput(name))
}

// StepsTableJSON is ledger.CreateStepsTableInput as TableJSON gives the
// ledger table's: the init hook creates the steps table from it.
func StepsTableJSON(name string) ([]byte, error) {
	return cliJSON(ledger.CreateStepsTableInput(name))
}

func cliJSON(in *dynamodb.CreateTableInput) ([]byte, error) {
	raw, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return json.MarshalIndent(dropEmpty(v), "", "  ")
}

func dropEmpty(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if e = dropEmpty(e); e != nil {
				out[k] = e
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	case []any:
		var out []any
		for _, e := range x {
			if e = dropEmpty(e); e != nil {
				out = append(out, e)
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	case string:
		if x == "" {
			return nil
		}
	}
	return v
}
