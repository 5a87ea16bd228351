// Command bareworker is the bare worker `make sizes` builds beside ours:
// a Lambda function fed by an SQS event source that makes the calls our
// worker makes on its common path with the bare SDK (a claim and a finish
// as DynamoDB UpdateItems, a retry's SQS SendMessage) and nothing else: no
// ledger, no logs or metrics of ours, no Scheduler client, no
// OpenTelemetry. Its bootstrap's size is what the SDK and the Lambda
// runtime cost alone; ours over it is what our packages add. It is never
// deployed.
package main

import (
	"context"
	"os"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

func main() {
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		panic(err)
	}
	db, q := dynamodb.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	table, queue := os.Getenv("NEXJOB_TABLE"), os.Getenv("NEXJOB_QUEUE_URL")
	lambda.Start(func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
		var resp events.SQSEventResponse
		for _, m := range ev.Records {
			key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "j#" + m.MessageId}}
			update := func(state string) error {
				_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
					TableName: aws.String(table), Key: key,
					UpdateExpression:          aws.String("SET #s = :s"),
					ExpressionAttributeNames:  map[string]string{"#s": "state"},
					ExpressionAttributeValues: map[string]types.AttributeValue{":s": &types.AttributeValueMemberS{Value: state}},
				})
				return err
			}
			if err := update("Processing"); err != nil {
				resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: m.MessageId})
				continue
			}
			if err := update("Succeeded"); err != nil {
				_, _ = q.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(m.Body), DelaySeconds: 1})
			}
		}
		return resp, nil
	})
}
