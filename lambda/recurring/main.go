// Command recurring is EventBridge Scheduler's target for recurring jobs
// (the construct's Recurring prop); see lambdamain.Recurring.
package main

import "github.com/nexjob/nexjob-aws/lambdamain"

func main() { lambdamain.Recurring(nil) }
