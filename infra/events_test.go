package infra_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/infra"
)

// TestCompletionEvents: off by default; with the prop, one more function
// (role events, told only its bus) on the table's stream, filtered to a
// job's end (a MODIFY from an active state to a terminal one), granted
// events:PutEvents on that bus alone and no table access, and a failure
// queue with its alarm.
func TestCompletionEvents(t *testing.T) {
	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Ev"), nil)
	bus := awsevents.NewEventBus(stack, jsii.String("Orders"), &awsevents.EventBusProps{EventBusName: jsii.String("orders")})
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code), CompletionEvents: &infra.CompletionEventsProps{Bus: bus}})
	if q.Events == nil || q.EventsFailures == nil || q.EventsFailureAlarm == nil {
		t.Fatal("the prop made no publisher")
	}
	tpl := assertions.Template_FromStack(stack, nil)
	tpl.ResourceCountIs(jsii.String("AWS::Lambda::Function"), jsii.Number(4))
	tpl.ResourceCountIs(jsii.String("AWS::Lambda::EventSourceMapping"), jsii.Number(4))
	tpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
		"Environment": map[string]any{"Variables": map[string]any{
			"NEXJOB_ROLE": "events", "NEXJOB_EVENT_BUS": map[string]any{"Ref": assertions.Match_StringLikeRegexp(jsii.String("^Orders"))},
			"NEXJOB_TABLE": assertions.Match_Absent(), "NEXJOB_QUEUE_URL": assertions.Match_Absent(), "NEXJOB_KEY_SECRET_PARAMETER": assertions.Match_Absent(),
		}},
	})
	tpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
		"EventSourceArn": map[string]any{"Fn::GetAtt": []any{assertions.Match_AnyValue(), "StreamArn"}},
		"FilterCriteria": map[string]any{"Filters": []any{map[string]any{
			"Pattern": `{"dynamodb":{"NewImage":{"state":{"S":["Succeeded","Failed","Expired"]}},"OldImage":{"state":{"S":["Enqueued","Scheduled","Processing","AwaitingContinuation"]}}},"eventName":["MODIFY"]}`,
		}}},
		"DestinationConfig": map[string]any{"OnFailure": map[string]any{
			"Destination": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("^JobsEventsFailures")), "Arn"}},
		}},
	})
	// Its role: nothing of the table but the stream, PutEvents on the bus.
	var raw map[string]any
	b, _ := json.Marshal(tpl.ToJSON())
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	var actions []string
	for id, r := range raw["Resources"].(map[string]any) {
		res := r.(map[string]any)
		if res["Type"] != "AWS::IAM::Policy" || !strings.HasPrefix(id, "JobsCompletionEvents") {
			continue
		}
		for _, st := range res["Properties"].(map[string]any)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			s := st.(map[string]any)
			for _, a := range toStrings(s["Action"]) {
				actions = append(actions, a)
				got, _ := json.Marshal(s["Resource"])
				switch {
				case a == "events:PutEvents" && !strings.Contains(string(got), "Orders"):
					t.Errorf("events:PutEvents on %s, want the bus only", got)
				case strings.HasPrefix(a, "sqs:") && !strings.Contains(string(got), "JobsEventsFailures"):
					t.Errorf("%s on %s, want its failure queue only", a, got)
				}
			}
		}
	}
	// The stream's reads, the bus, its own logs, and its failure queue
	// (the mapping's OnFailure destination is sent by the function's role).
	want := "dynamodb:DescribeStream dynamodb:GetRecords dynamodb:GetShardIterator dynamodb:ListStreams events:PutEvents " +
		"logs:CreateLogStream logs:PutLogEvents sqs:GetQueueAttributes sqs:GetQueueUrl sqs:SendMessage"
	slices.Sort(actions)
	if got := strings.Join(slices.Compact(actions), " "); got != want {
		t.Fatalf("the publisher's actions: %s; want %s", got, want)
	}
}
