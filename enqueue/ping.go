package enqueue

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Ping checks that the table and the queue exist, with one DescribeTable
// and one GetQueueAttributes. Call it at start so that a wrong name fails
// there, clearly, rather than on the first job. A missing resource is a
// *MissingResourceError.
func (c *Client) Ping(ctx context.Context) error {
	_, err := dynamodb.NewFromConfig(c.cfg).DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(c.store.Table())})
	if err != nil {
		return c.missing(fmt.Errorf("nexjob: describe table: %w", err))
	}
	_, err = sqs.NewFromConfig(c.cfg).GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(c.queueURL), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return c.missing(fmt.Errorf("nexjob: queue attributes: %w", err))
	}
	return nil
}

// missing turns "no such table / queue" into a *MissingResourceError and
// returns anything else as it is.
func (c *Client) missing(err error) error {
	var noTable *ddbtypes.ResourceNotFoundException
	var noQueue *sqstypes.QueueDoesNotExist
	switch {
	case err == nil:
		return nil
	case errors.As(err, &noTable):
		return &MissingResourceError{Resource: c.store.Table(), Err: err}
	case errors.As(err, &noQueue):
		return &MissingResourceError{Resource: c.queueURL, Err: err}
	}
	return err // already wrapped with its context by the ledger or Send
}
