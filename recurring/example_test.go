package recurring_test

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/nexjob/nexjob-aws/recurring"
)

// A nightly report, one run at a time (SkipIfRunning). In a deployment the
// options come from settings.Load(ctx, settings.Producer).Schedules.
func ExampleClient_Recurring() {
	ctx := context.Background()
	cfg, _ := config.LoadDefaultConfig(ctx)
	r := recurring.New(cfg, recurring.Options{
		TargetARN: "arn:aws:lambda:us-east-1:123456789012:function:nexjob-recurring",
		RoleARN:   "arn:aws:iam::123456789012:role/nexjob-scheduler",
	})
	id := fmt.Sprintf("nightly-report-%d", time.Now().UnixNano())
	if err := r.Recurring(ctx, id, "cron(0 2 * * ? *)", report{Name: "sales"}, nil); err != nil {
		panic(err)
	}
	list, _ := r.List(ctx)
	for _, s := range list {
		if s.ID == id {
			fmt.Println(s.Expression, s.Firing.Kind, s.Firing.Concurrency)
		}
	}
	_ = r.Remove(ctx, id)
	// Output:
	// cron(0 2 * * ? *) report SkipIfRunning
}
