package infra_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/infra"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/recurring"
)

type nightly struct{ Region string }

func (nightly) Kind() string { return "reports.nightly" }

// TestRecurringDeclaredInTheStack (issue 41 item 3): a recurring job
// declared with AddRecurring is a schedule of the stack, in the
// construct's group, targeting the recurring function with the scheduler
// role and the DLQ, with the input recurring.ScheduleOf makes; that
// input, its time filled in as Scheduler fills it, enqueues the job
// through recurring.Fire on the emulator. A bad expression panics at
// synth, naming the schedule.
func TestRecurringDeclaredInTheStack(t *testing.T) {
	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Rec"), nil)
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code), Recurring: jsii.Bool(true)})
	q.AddRecurring("nightly-eu", "cron(0 2 * * ? *)", nightly{Region: "eu"}, &recurring.Opts{Timezone: "Europe/Paris"})
	var doc map[string]any
	b, _ := json.Marshal(assertions.Template_FromStack(stack, nil).ToJSON())
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var props map[string]any
	for _, res := range doc["Resources"].(map[string]any) {
		r := res.(map[string]any)
		if r["Type"] == "AWS::Scheduler::Schedule" {
			props = r["Properties"].(map[string]any)
		}
	}
	if props == nil || props["Name"] != "nightly-eu" || props["ScheduleExpression"] != "cron(0 2 * * ? *)" || props["ScheduleExpressionTimezone"] != "Europe/Paris" || props["GroupName"] == nil {
		t.Fatalf("the stack's schedule: %v", props)
	}
	target := props["Target"].(map[string]any)
	if target["Arn"] == nil || target["RoleArn"] == nil || target["DeadLetterConfig"] == nil {
		t.Fatalf("its target: %v", target)
	}
	input := target["Input"].(string)
	_, want, err := recurring.ScheduleOf("nightly-eu", "cron(0 2 * * ? *)", nightly{Region: "eu"}, &recurring.Opts{Timezone: "Europe/Paris"})
	if err != nil || input != string(want) || !strings.Contains(input, "<aws.scheduler.scheduled-time>") {
		t.Fatalf("its input %s, want %s (%v)", input, want, err)
	}
	// Scheduler's firing: the input with its time, to the target's code.
	e := nexjobtest.New(t, nil)
	var f recurring.Firing
	if err := json.Unmarshal([]byte(strings.Replace(input, "<aws.scheduler.scheduled-time>", "2027-01-05T01:00:00Z", 1)), &f); err != nil {
		t.Fatal(err)
	}
	res, err := recurring.Fire(context.Background(), e.Client, f)
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.Get(t, res.ID); rec.Kind != "reports.nightly" || !strings.Contains(rec.Args, `"eu"`) || rec.State != ledger.Enqueued {
		t.Fatalf("the firing enqueued %+v", rec)
	}

	defer func() {
		if v := recover(); v == nil || !strings.Contains(v.(string), `AddRecurring("bad")`) {
			t.Fatalf("a bad expression: %v, want a panic naming the schedule", v)
		}
	}()
	q.AddRecurring("bad", "every day at two", nightly{}, nil)
}
