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
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/infra"
	"github.com/nexjob/nexjob-aws/ledger"
)

// synth builds a stack with a JobQueue (and a producer granted enqueue)
// over placeholder bootstraps, and returns its template.
func synth(t *testing.T) (assertions.Template, map[string]any) {
	t.Helper()
	code := t.TempDir()
	for _, f := range []string{"worker", "deadletter", "guard"} {
		if err := os.MkdirAll(filepath.Join(code, f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(code, f, "bootstrap"), []byte("placeholder "+f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Test"), nil)
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{CodeDir: code})
	producer := awsiam.NewRole(stack, jsii.String("Producer"), &awsiam.RoleProps{AssumedBy: awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil)})
	q.GrantEnqueue(producer)
	tpl := assertions.Template_FromStack(stack, nil)
	var raw map[string]any
	b, _ := json.Marshal(tpl.ToJSON())
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	return tpl, raw
}

func TestJobQueueTemplate(t *testing.T) {
	tpl, raw := synth(t)
	for typ, n := range map[string]float64{
		"AWS::DynamoDB::Table": 2, "AWS::SQS::Queue": 3, "AWS::Lambda::Function": 3,
		"AWS::Lambda::EventSourceMapping": 3, "AWS::CloudWatch::Alarm": 4, "AWS::Logs::LogGroup": 3,
		"AWS::CloudWatch::Dashboard": 1,
	} {
		tpl.ResourceCountIs(jsii.String(typ), jsii.Number(n))
	}

	// The table: the ledger's schema, on demand, TTL, PITR, encryption, stream, index.
	tpl.HasResourceProperties(jsii.String("AWS::DynamoDB::Table"), map[string]any{
		"KeySchema":                        []any{map[string]any{"AttributeName": ledger.AttrPK, "KeyType": "HASH"}},
		"BillingMode":                      "PAY_PER_REQUEST",
		"TimeToLiveSpecification":          map[string]any{"AttributeName": ledger.TTLAttribute, "Enabled": true},
		"PointInTimeRecoverySpecification": map[string]any{"PointInTimeRecoveryEnabled": true},
		"SSESpecification":                 map[string]any{"SSEEnabled": true},
		"StreamSpecification":              map[string]any{"StreamViewType": "NEW_AND_OLD_IMAGES"},
		"GlobalSecondaryIndexes": []any{map[string]any{
			"IndexName": ledger.IndexByState,
			"KeySchema": []any{
				map[string]any{"AttributeName": ledger.AttrListState, "KeyType": "HASH"},
				map[string]any{"AttributeName": ledger.AttrListAt, "KeyType": "RANGE"},
			},
			"Projection": map[string]any{"ProjectionType": "INCLUDE", "NonKeyAttributes": toAny(ledger.IndexProjection)},
		}},
	})

	// The steps table: the job's id and the step's key, on demand, TTL, PITR, encryption.
	tpl.HasResourceProperties(jsii.String("AWS::DynamoDB::Table"), map[string]any{
		"KeySchema": []any{
			map[string]any{"AttributeName": ledger.AttrPK, "KeyType": "HASH"},
			map[string]any{"AttributeName": ledger.AttrStepKey, "KeyType": "RANGE"},
		},
		"BillingMode":                      "PAY_PER_REQUEST",
		"TimeToLiveSpecification":          map[string]any{"AttributeName": ledger.TTLAttribute, "Enabled": true},
		"PointInTimeRecoverySpecification": map[string]any{"PointInTimeRecoveryEnabled": true},
		"SSESpecification":                 map[string]any{"SSEEnabled": true},
	})

	// The queues: encrypted, redrive to the DLQ, visibility 6 × the 30 s timeout.
	tpl.HasResourceProperties(jsii.String("AWS::SQS::Queue"), map[string]any{
		"VisibilityTimeout":    180,
		"SqsManagedSseEnabled": true,
		"RedrivePolicy": map[string]any{
			"deadLetterTargetArn": assertions.Match_AnyValue(),
			"maxReceiveCount":     5,
		},
	})
	tpl.HasResourceProperties(jsii.String("AWS::SQS::Queue"), map[string]any{
		"MessageRetentionPeriod": 1209600, "SqsManagedSseEnabled": true, "VisibilityTimeout": 360,
	})

	// Functions: arm64, provided.al2023, bootstrap.
	fns := tpl.FindResources(jsii.String("AWS::Lambda::Function"), nil)
	for id, r := range *fns {
		props := (*r)["Properties"].(map[string]any)
		if props["Runtime"] != "provided.al2023" || props["Handler"] != "bootstrap" || !slices.Equal(toStrings(props["Architectures"]), []string{"arm64"}) {
			t.Errorf("function %s: %v %v %v", id, props["Runtime"], props["Handler"], props["Architectures"])
		}
	}
	tpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
		"Timeout": 30, "MemorySize": 256,
		"Environment": map[string]any{"Variables": map[string]any{
			"NEXJOB_TABLE": assertions.Match_AnyValue(), "NEXJOB_QUEUE_URL": assertions.Match_AnyValue(), "NEXJOB_DLQ_URL": assertions.Match_AnyValue(),
		}},
	})

	// SQS event sources report partial batch failures.
	tpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
		"BatchSize": 10, "FunctionResponseTypes": []any{"ReportBatchItemFailures"},
		"EventSourceArn": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("JobsQueue")), "Arn"}},
	})
	tpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
		"FunctionResponseTypes": []any{"ReportBatchItemFailures"},
		"EventSourceArn":        map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("JobsDLQ")), "Arn"}},
	})
	// The guard reads the stream, filtered to jobs that became runnable
	// and to first claims (which spare their check), ten seconds a batch.
	tpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
		"StartingPosition":               "TRIM_HORIZON",
		"MaximumBatchingWindowInSeconds": 10,
		"EventSourceArn":                 map[string]any{"Fn::GetAtt": []any{assertions.Match_AnyValue(), "StreamArn"}},
		"FilterCriteria": map[string]any{"Filters": []any{map[string]any{
			"Pattern": `{"dynamodb":{"NewImage":{"attempt":{"N":["0"]},"state":{"S":["Enqueued","Scheduled"]}}},"eventName":["INSERT","MODIFY"]}`,
		}, map[string]any{
			"Pattern": `{"dynamodb":{"NewImage":{"attempt":{"N":["1"]},"state":{"S":["Processing"]}}},"eventName":["MODIFY"]}`,
		}}},
		// A batch given up on goes to the guard's failure queue, alarmed.
		"DestinationConfig": map[string]any{"OnFailure": map[string]any{
			"Destination": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("^JobsGuardFailures")), "Arn"}},
		}},
	})
	tpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"MetricName": "ApproximateNumberOfMessagesVisible", "Threshold": 0,
		"Dimensions": []any{map[string]any{"Name": "QueueName", "Value": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("^JobsGuardFailures")), "QueueName"}}}},
	})

	// Alarms on DLQ depth and the oldest message's age.
	tpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"MetricName": "ApproximateNumberOfMessagesVisible", "Threshold": 0, "ComparisonOperator": "GreaterThanThreshold",
	})
	tpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"MetricName": "ApproximateAgeOfOldestMessage", "Threshold": 900,
	})

	// The failure-rate alarm reads the functions' EMF metrics.
	tpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"Threshold": 10,
		"Metrics": assertions.Match_ArrayWith(&[]any{
			assertions.Match_ObjectLike(&map[string]any{"Expression": "100 * f / (s + f)"}),
			assertions.Match_ObjectLike(&map[string]any{"MetricStat": assertions.Match_ObjectLike(&map[string]any{
				"Metric": map[string]any{"Namespace": "NexJob", "MetricName": "Failed"}})}),
		}),
	})

	checkIAM(t, raw)
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// checkIAM asserts every policy's exact actions and that no statement
// grants "*" or any resource wildcard broader than the table's indexes or
// its stream.
func checkIAM(t *testing.T, raw map[string]any) {
	t.Helper()
	far := []string{"scheduler:CreateSchedule", "scheduler:UpdateSchedule", "scheduler:DeleteSchedule"} // far jobs' one-time schedules
	want := map[string][][]string{
		"JobsWorkerRole": {
			{"logs:CreateLogStream", "logs:PutLogEvents"},
			far, {"iam:PassRole"},
			{"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"},
			{"dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"}, // the steps table
			{"s3:PutObject", "s3:GetObject"},                              // large step values and results, under steps/ and results/
			{"sqs:SendMessage", "sqs:ChangeMessageVisibility"},
			{"sqs:SendMessage"},
			{"sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueUrl", "sqs:DeleteMessage", "sqs:GetQueueAttributes"},
		},
		"JobsDeadLetterConsumerRole": {
			{"logs:CreateLogStream", "logs:PutLogEvents"},
			far, {"iam:PassRole"},
			{"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"},
			{"sqs:SendMessage"},
			{"sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueUrl", "sqs:DeleteMessage", "sqs:GetQueueAttributes"},
		},
		"JobsDispatchGuardRole": {
			{"logs:CreateLogStream", "logs:PutLogEvents"},
			{"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator", "dynamodb:ListStreams"},
			{"sqs:SendMessage"},
			{"scheduler:CreateSchedule"}, {"iam:PassRole"}, // far jobs' checks: their own schedule, made if missing
			{"sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"}, // its failure queue (the CDK's SqsDlq grant)
		},
		"Producer": {
			{"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:DescribeTable"},
			{"sqs:SendMessage", "sqs:GetQueueAttributes"},
			far, {"iam:PassRole"},
			{"s3:GetObject"}, // a result over a record's room (Client.Result, Wait), under results/
			{"s3:PutObject"}, // args over a record's room, under args/
		},
		// Scheduler's role for far jobs: send to the job queue, and to the
		// DLQ a message the queue refused for 24 hours; nothing else.
		"JobsFarScheduleRole": {
			{"sqs:SendMessage"}, {"sqs:SendMessage"},
		},
	}
	seen := map[string]bool{}
	for id, r := range raw["Resources"].(map[string]any) {
		res := r.(map[string]any)
		if res["Type"] == "AWS::IAM::ManagedPolicy" || res["Type"] == "AWS::IAM::Role" && res["Properties"].(map[string]any)["ManagedPolicyArns"] != nil {
			t.Errorf("%s uses a managed policy", id)
		}
		if res["Type"] != "AWS::IAM::Policy" {
			continue
		}
		var role string
		for prefix := range want {
			if len(id) > len(prefix) && id[:len(prefix)] == prefix {
				role = prefix
			}
		}
		if role == "" {
			t.Errorf("unexpected policy %s", id)
			continue
		}
		seen[role] = true
		stmts := res["Properties"].(map[string]any)["PolicyDocument"].(map[string]any)["Statement"].([]any)
		var got [][]string
		for _, s := range stmts {
			st := s.(map[string]any)
			got = append(got, toStrings(st["Action"]))
			checkResource(t, id, st["Resource"])
			if st["Effect"] != "Allow" {
				t.Errorf("%s: effect %v", id, st["Effect"])
			}
		}
		if !slices.EqualFunc(got, want[role], slices.Equal) {
			t.Errorf("%s actions:\n got %v\nwant %v", id, got, want[role])
		}
	}
	for role := range want {
		if !seen[role] {
			t.Errorf("no policy for %s", role)
		}
	}
}

func checkResource(t *testing.T, id string, r any) {
	t.Helper()
	switch v := r.(type) {
	case string:
		if v == "*" {
			t.Errorf("%s grants on *", id)
		}
	case []any:
		for _, x := range v {
			checkResource(t, id, x)
		}
	case map[string]any:
		if j, ok := v["Fn::Join"].([]any); ok {
			parts := j[1].([]any)
			if last, ok := parts[len(parts)-1].(string); ok && last != "/index/*" && last != "/steps/*" && last != "/results/*" && last != "/args/*" && last[len(last)-1] == '*' && len(parts) < 3 {
				t.Errorf("%s grants on a wildcard %v", id, parts)
			}
		}
	}
}

func toStrings(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, e.(string))
		}
		return out
	}
	return nil
}

// panics returns the message f panics with ("" if it does not).
func panics(f func()) (msg string) {
	defer func() {
		if v := recover(); v != nil {
			msg = fmt.Sprint(v)
		}
	}()
	f()
	return ""
}

// TestJobQueueNeedsCode: a missing asset is a clear message naming the
// prop or the path, not a jsii stack trace.
func TestJobQueueNeedsCode(t *testing.T) {
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	msg := panics(func() { infra.NewJobQueue(awscdk.NewStack(app, jsii.String("X"), nil), "Jobs", &infra.JobQueueProps{}) })
	if !strings.Contains(msg, "JobQueueProps.Code") || !strings.Contains(msg, "WorkerCode") {
		t.Fatalf("no code: %q", msg)
	}
	empty := t.TempDir()
	msg = panics(func() { infra.BootstrapCode(empty) })
	if !strings.Contains(msg, empty+" has no bootstrap") {
		t.Fatalf("missing bootstrap: %q", msg)
	}
	msg = panics(func() {
		infra.NewJobQueue(awscdk.NewStack(app, jsii.String("Y"), nil), "Jobs", &infra.JobQueueProps{CodeDir: empty})
	})
	if !strings.Contains(msg, filepath.Join(empty, "worker")+" has no bootstrap") {
		t.Fatalf("CodeDir without bootstraps: %q", msg)
	}
}

// TestJobQueueOneBinaryNoGuard: one Code for every role (each told its
// role), the guard left out, the settings on every function, the key
// secret's parameter readable by the functions and by producers.
func TestJobQueueOneBinaryNoGuard(t *testing.T) {
	stack, code := oneBinaryStack(t, "One")
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{
		Code: code, NoGuard: jsii.Bool(true), IndexAllStates: jsii.Bool(true),
		Retention:          &infra.Retention{Failed: awscdk.Duration_Days(jsii.Number(90))},
		KeySecretParameter: jsii.String("/orders/key-secret"),
	})
	producer := awsiam.NewRole(stack, jsii.String("Producer"), &awsiam.RoleProps{AssumedBy: awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil)})
	q.GrantEnqueue(producer)
	if q.Guard != nil {
		t.Fatal("a guard with NoGuard")
	}
	tpl := assertions.Template_FromStack(stack, nil)
	tpl.ResourceCountIs(jsii.String("AWS::Lambda::Function"), jsii.Number(2))
	tpl.ResourceCountIs(jsii.String("AWS::Lambda::EventSourceMapping"), jsii.Number(2))
	for _, role := range []string{"worker", "deadletter"} {
		tpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": map[string]any{
				"NEXJOB_ROLE": role, "NEXJOB_INDEX_ALL_STATES": "true",
				"NEXJOB_RETENTION":            "succeeded=168h0m0s,failed=2160h0m0s,expired=168h0m0s",
				"NEXJOB_KEY_SECRET_PARAMETER": "/orders/key-secret",
			}},
		})
	}
	for _, who := range []string{"JobsWorkerRole", "JobsDeadLetterConsumerRole", "Producer"} {
		tpl.HasResourceProperties(jsii.String("AWS::IAM::Policy"), map[string]any{
			"Roles": []any{map[string]any{"Ref": assertions.Match_StringLikeRegexp(jsii.String("^" + who))}},
			"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{
				assertions.Match_ObjectLike(&map[string]any{"Action": "ssm:GetParameter"}),
			})},
		})
	}
}

// TestWebDashboard: off by default; with the prop, one more function
// (role dashboard) behind an IAM-authenticated, streaming function URL,
// read grants only unless Write, and never the write actions when read-only.
func TestWebDashboard(t *testing.T) {
	_, raw := synth(t)
	for _, res := range raw["Resources"].(map[string]any) {
		if res.(map[string]any)["Type"] == "AWS::Lambda::Url" {
			t.Fatal("a function URL without the WebDashboard prop")
		}
	}
	for _, write := range []bool{false, true} {
		code := t.TempDir()
		if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
			t.Fatal(err)
		}
		app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
		stack := awscdk.NewStack(app, jsii.String(fmt.Sprintf("Dash%v", write)), nil)
		q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code), WebDashboard: &infra.WebDashboardProps{Write: jsii.Bool(write)}})
		if q.WebDashboard == nil || q.WebDashboardURL == nil {
			t.Fatal("no dashboard function or URL")
		}
		tpl := assertions.Template_FromStack(stack, nil)
		tpl.ResourceCountIs(jsii.String("AWS::Lambda::Function"), jsii.Number(4))
		tpl.HasResourceProperties(jsii.String("AWS::Lambda::Url"), map[string]any{"AuthType": "AWS_IAM", "InvokeMode": "RESPONSE_STREAM"})
		tpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": map[string]any{"NEXJOB_ROLE": "dashboard", "NEXJOB_DASHBOARD_WRITE": fmt.Sprint(write)}},
		})
		var actions []string
		b, _ := json.Marshal(tpl.ToJSON())
		var doc map[string]any
		_ = json.Unmarshal(b, &doc)
		for _, res := range doc["Resources"].(map[string]any) {
			r := res.(map[string]any)
			if r["Type"] != "AWS::IAM::Policy" {
				continue
			}
			props := r["Properties"].(map[string]any)
			if !strings.Contains(fmt.Sprint(props["Roles"]), "JobsWebDashboardRole") {
				continue
			}
			for _, st := range props["PolicyDocument"].(map[string]any)["Statement"].([]any) {
				switch a := st.(map[string]any)["Action"].(type) {
				case string:
					actions = append(actions, a)
				case []any:
					for _, x := range a {
						actions = append(actions, x.(string))
					}
				}
			}
		}
		for _, a := range []string{"dynamodb:GetItem", "dynamodb:Query", "dynamodb:Scan", "sqs:ReceiveMessage", "sqs:GetQueueAttributes"} {
			if !slices.Contains(actions, a) {
				t.Fatalf("write=%v: the dashboard lacks %s: %v", write, a, actions)
			}
		}
		for _, a := range []string{"dynamodb:UpdateItem", "dynamodb:DeleteItem", "sqs:SendMessage", "sqs:DeleteMessage"} {
			if slices.Contains(actions, a) != write {
				t.Fatalf("write=%v: %s granted %v: %v", write, a, !write, actions)
			}
		}
	}
}

// TestRecurring: the prop adds a schedule group, the target function
// (role recurring, allowed to enqueue), and Scheduler's role, allowed to
// invoke only the target; producers get the schedule settings, and
// GrantSchedule gives the schedule actions and the role to pass.
func TestRecurring(t *testing.T) {
	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Rec"), nil)
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code), Recurring: jsii.Bool(true)})
	ops := awsiam.NewRole(stack, jsii.String("Ops"), &awsiam.RoleProps{AssumedBy: awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil)})
	q.GrantSchedule(ops)
	env := *q.Settings("producer")
	for _, k := range []string{"NEXJOB_SCHEDULE_GROUP", "NEXJOB_SCHEDULE_TARGET_ARN", "NEXJOB_SCHEDULER_ROLE_ARN"} {
		if env[k] == nil {
			t.Fatalf("producer settings lack %s", k)
		}
	}
	tpl := assertions.Template_FromStack(stack, nil)
	tpl.ResourceCountIs(jsii.String("AWS::Scheduler::ScheduleGroup"), jsii.Number(2)) // recurring jobs', far jobs' (TestFarAndRecurringSchedulesApart)
	tpl.ResourceCountIs(jsii.String("AWS::Lambda::Function"), jsii.Number(4))
	tpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
		"Environment": map[string]any{"Variables": map[string]any{"NEXJOB_ROLE": "recurring"}},
	})
	// The trust policy names this account; PassRole is for Scheduler only.
	tpl.HasResourceProperties(jsii.String("AWS::IAM::Role"), map[string]any{
		"AssumeRolePolicyDocument": map[string]any{"Statement": []any{map[string]any{
			"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": map[string]any{"Service": "scheduler.amazonaws.com"},
			"Condition": map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": map[string]any{"Ref": "AWS::AccountId"}}},
		}}},
	})
	tpl.HasResourceProperties(jsii.String("AWS::IAM::Policy"), map[string]any{
		"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{
			"Action": "iam:PassRole", "Condition": map[string]any{"StringEquals": map[string]any{"iam:PassedToService": "scheduler.amazonaws.com"}},
		})})},
	})
	tpl.HasResourceProperties(jsii.String("AWS::IAM::Policy"), map[string]any{
		"Roles": []any{map[string]any{"Ref": assertions.Match_StringLikeRegexp(jsii.String("^JobsSchedulerRole"))}},
		"PolicyDocument": map[string]any{"Statement": []any{assertions.Match_ObjectLike(&map[string]any{
			"Action": assertions.Match_AnyValue(), "Effect": "Allow",
			"Resource": assertions.Match_ArrayWith(&[]any{map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("^JobsRecurringTarget")), "Arn"}}}),
		}), assertions.Match_ObjectLike(&map[string]any{ // a firing it could not deliver, to the DLQ
			"Action": "sqs:SendMessage", "Effect": "Allow",
			"Resource": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("^JobsDLQ")), "Arn"}},
		})}},
	})
	b, _ := json.Marshal(tpl.ToJSON())
	for _, a := range []string{"scheduler:CreateSchedule", "scheduler:DeleteSchedule", "scheduler:GetSchedule", "scheduler:ListSchedules", "iam:PassRole"} {
		if !strings.Contains(string(b), `"`+a+`"`) {
			t.Fatalf("GrantSchedule lacks %s", a)
		}
	}
}

// TestActiveTracing: the prop turns on X-Ray active tracing on every
// function; off by default.
func TestActiveTracing(t *testing.T) {
	for _, on := range []bool{false, true} {
		code := t.TempDir()
		if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
			t.Fatal(err)
		}
		app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
		stack := awscdk.NewStack(app, jsii.String(fmt.Sprintf("Trace%v", on)), nil)
		infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code), ActiveTracing: jsii.Bool(on)})
		tpl := assertions.Template_FromStack(stack, nil)
		fns := tpl.FindResources(jsii.String("AWS::Lambda::Function"), nil)
		for id, r := range *fns {
			cfg, _ := (*r)["Properties"].(map[string]any)["TracingConfig"].(map[string]any)
			mode, _ := cfg["Mode"].(string)
			if want := map[bool]string{true: "Active", false: ""}[on]; mode != want {
				t.Errorf("ActiveTracing=%v: function %s tracing %q, want %q", on, id, mode, want)
			}
		}
	}
}

// TestWorkerScalingProps: the worker's event source takes a concurrency
// cap, a batching window and provisioned pollers, the function a
// reserved concurrency; none is set by default.
func TestWorkerScalingProps(t *testing.T) {
	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Scale"), nil)
	infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code),
		MaxConcurrency: jsii.Number(50), ReservedConcurrency: jsii.Number(100), MaxBatchingWindow: awscdk.Duration_Seconds(jsii.Number(2))})
	tpl := assertions.Template_FromStack(stack, nil)
	tpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
		"ScalingConfig": map[string]any{"MaximumConcurrency": 50}, "MaximumBatchingWindowInSeconds": 2,
		"EventSourceArn": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("JobsQueue")), "Arn"}},
	})
	tpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{"ReservedConcurrentExecutions": 100})

	app2 := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	polled := awscdk.NewStack(app2, jsii.String("Pollers"), nil)
	infra.NewJobQueue(polled, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code),
		ProvisionedPollers: &awslambda.ProvisionedPollerConfig{MinimumPollers: jsii.Number(5), MaximumPollers: jsii.Number(100)}})
	assertions.Template_FromStack(polled, nil).HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
		"ProvisionedPollerConfig": map[string]any{"MinimumPollers": 5, "MaximumPollers": 100},
		"EventSourceArn":          map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("JobsQueue")), "Arn"}},
	})
}

// TestReadOnlyRolesGetNoKeySecret (issue 38 item 14): a read-only role
// (GrantRead, the read-only web dashboard) is not given the key secret:
// with it and the table, a reader could mint what the secret guards. Its
// function runs with NEXJOB_KEY_SECRET_WITHHELD; a write dashboard, an
// operator, keeps the secret for lookups by key.
func TestReadOnlyRolesGetNoKeySecret(t *testing.T) {
	for _, write := range []bool{false, true} {
		code := t.TempDir()
		if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
			t.Fatal(err)
		}
		app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
		stack := awscdk.NewStack(app, jsii.String(fmt.Sprintf("Secret%v", write)), nil)
		reader := awsiam.NewRole(stack, jsii.String("Reader"), &awsiam.RoleProps{AssumedBy: awsiam.NewAccountRootPrincipal()})
		q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code), KeySecretParameter: jsii.String("/app/key-secret"),
			WebDashboard: &infra.WebDashboardProps{Write: jsii.Bool(write)}})
		q.GrantRead(reader)
		b, _ := json.Marshal(assertions.Template_FromStack(stack, nil).ToJSON())
		var doc map[string]any
		_ = json.Unmarshal(b, &doc)
		ssmOf := func(role string) bool {
			for _, res := range doc["Resources"].(map[string]any) {
				r := res.(map[string]any)
				if r["Type"] == "AWS::IAM::Policy" && strings.Contains(fmt.Sprint(r["Properties"].(map[string]any)["Roles"]), role) &&
					strings.Contains(fmt.Sprint(r["Properties"]), "ssm:GetParameter") {
					return true
				}
			}
			return false
		}
		if ssmOf("Reader") {
			t.Errorf("GrantRead gave the key secret's parameter")
		}
		if got := ssmOf("JobsWebDashboardRole"); got != write {
			t.Errorf("write=%v: the dashboard may read the key secret: %v", write, got)
		}
		for _, res := range doc["Resources"].(map[string]any) {
			r := res.(map[string]any)
			vars := fmt.Sprint(r["Properties"])
			if r["Type"] != "AWS::Lambda::Function" || !strings.Contains(vars, "NEXJOB_ROLE:dashboard") {
				continue
			}
			if withheld := strings.Contains(vars, "NEXJOB_KEY_SECRET_WITHHELD:true"); withheld == write || strings.Contains(vars, "NEXJOB_KEY_SECRET_PARAMETER") == !write {
				t.Errorf("write=%v: the dashboard's environment: %s", write, vars)
			}
		}
	}
}
