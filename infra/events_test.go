package infra_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
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

// TestCompletionEventsOnABusOfTheirOwn: by default the ends go to a bus
// of the construct's own, not the account's default bus (where a plain
// PutEvents of anyone's delivered "refund Succeeded" to a team's rule for
// a job the ledger held Failed, and every rule owner read every job's end
// and error). The publisher is told that bus and is the only role of the
// stack granted events:PutEvents, on it alone; the bus's resource policy
// denies PutEvents to every principal but the publisher's role, whatever
// its IAM allows. Bus still names another.
func TestCompletionEventsOnABusOfTheirOwn(t *testing.T) {
	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Ends"), nil)
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{
		Code: infra.BootstrapCode(code), CompletionEvents: &infra.CompletionEventsProps{},
		WebDashboard: &infra.WebDashboardProps{Write: jsii.Bool(true)}, Recurring: jsii.Bool(true),
	})
	for _, grant := range []func(awsiam.IGrantable){q.GrantEnqueue, q.GrantOperate, q.GrantSignal, q.GrantRead} {
		grant(awsiam.NewRole(stack, jsii.String(fmt.Sprintf("Team%p", grant)), &awsiam.RoleProps{AssumedBy: awsiam.NewAccountRootPrincipal()}))
	}
	var raw map[string]any
	b, _ := json.Marshal(assertions.Template_FromStack(stack, nil).ToJSON())
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	resources := raw["Resources"].(map[string]any)
	var buses []string
	var publisherRole string
	var told any
	for id, r := range resources {
		res := r.(map[string]any)
		switch res["Type"] {
		case "AWS::Events::EventBus":
			buses = append(buses, id)
		case "AWS::Lambda::Function":
			props := res["Properties"].(map[string]any)
			if vars := props["Environment"].(map[string]any)["Variables"].(map[string]any); vars["NEXJOB_ROLE"] == "events" {
				told, publisherRole = vars["NEXJOB_EVENT_BUS"], props["Role"].(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
			}
		}
	}
	if len(buses) != 1 {
		t.Fatalf("event buses in the stack: %v, want one of the construct's own (the publisher is told %v)", buses, told)
	}
	bus := buses[0]
	if got, _ := json.Marshal(told); string(got) != `{"Ref":"`+bus+`"}` {
		t.Errorf("the publisher's NEXJOB_EVENT_BUS: %s, want the construct's bus %s", got, bus)
	}
	if q.EventBus == nil {
		t.Error("JobQueue.EventBus is nil: teams have no bus to attach their rules to")
	}
	// events:PutEvents: the publisher's role alone, on the bus alone.
	for _, r := range resources {
		res := r.(map[string]any)
		if res["Type"] != "AWS::IAM::Policy" {
			continue
		}
		props := res["Properties"].(map[string]any)
		roles, _ := json.Marshal(props["Roles"])
		for _, st := range props["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			s := st.(map[string]any)
			if !slices.ContainsFunc(toStrings(s["Action"]), func(a string) bool { return strings.HasPrefix(a, "events:") }) {
				continue
			}
			on, _ := json.Marshal(s["Resource"])
			if string(roles) != `[{"Ref":"`+publisherRole+`"}]` || string(on) != `{"Fn::GetAtt":["`+bus+`","Arn"]}` {
				t.Errorf("%v on %s granted to %s; want events:PutEvents on the construct's bus to the publisher alone", s["Action"], on, roles)
			}
		}
	}
	// Its resource policy: every other principal denied.
	var policies []string
	for _, r := range resources {
		res := r.(map[string]any)
		if res["Type"] != "AWS::Events::EventBusPolicy" {
			continue
		}
		got, _ := json.Marshal(res["Properties"])
		policies = append(policies, string(got))
	}
	want := []string{`"Effect":"Deny"`, `"Principal":{"AWS":"*"}`, `"Action":"events:PutEvents"`, `"ArnNotEquals":{"aws:PrincipalArn":{"Fn::GetAtt":["` + publisherRole + `","Arn"]}}`, `"EventBusName":{"Ref":"` + bus + `"}`}
	if len(policies) != 1 || slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(policies[0], w) }) {
		t.Errorf("the bus's resource policies: %v; want one denying events:PutEvents to every principal but the publisher's role (%v)", policies, want)
	}
}
