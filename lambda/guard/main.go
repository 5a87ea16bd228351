// Command guard is the Lambda function fed by the ledger table's DynamoDB
// stream (filtered to jobs becoming Enqueued or Scheduled with attempt 0).
// It sends the delayed check messages that recover jobs written but never
// sent. Wiring only.
package main

import "github.com/nexjob/nexjob-aws/lambdamain"

func main() { lambdamain.Guard(nil) }
