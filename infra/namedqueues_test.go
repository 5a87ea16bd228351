package infra_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/infra"
	"github.com/nexjob/nexjob-aws/settings"
)

// TestNamedQueues: each named queue is a queue of its own with its own
// DLQ (and its alarm), an event source on the worker with its own
// MaxConcurrency, one on the DLQ consumer for its DLQ; NEXJOB_QUEUES names
// them on every function and in Settings; a producer may send to each.
func TestNamedQueues(t *testing.T) {
	stack, code := oneBinaryStack(t, "Named")
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{
		Code: code,
		NamedQueues: []infra.NamedQueueProps{
			{Name: jsii.String("bulk"), MaxConcurrency: jsii.Number(5)},
			{Name: jsii.String("payments"), MaxConcurrency: jsii.Number(50), BatchSize: jsii.Number(1)},
		},
	})
	producer := awsiam.NewRole(stack, jsii.String("Producer"), &awsiam.RoleProps{AssumedBy: awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil)})
	q.GrantEnqueue(producer)
	tpl := assertions.Template_FromStack(stack, nil)
	tpl.ResourceCountIs(jsii.String("AWS::SQS::Queue"), jsii.Number(2+4+1)) // job queue and DLQ, two named with DLQs, the guard's failures
	for name, max := range map[string]float64{"bulk": 5, "payments": 50} {
		tpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
			"FunctionName":   map[string]any{"Ref": assertions.Match_StringLikeRegexp(jsii.String("^JobsWorker"))},
			"EventSourceArn": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("^JobsQueue" + name)), "Arn"}},
			"ScalingConfig":  map[string]any{"MaximumConcurrency": max},
		})
		tpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
			"FunctionName":   map[string]any{"Ref": assertions.Match_StringLikeRegexp(jsii.String("^JobsDeadLetterConsumer"))},
			"EventSourceArn": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("^JobsQueue" + name + "DLQ")), "Arn"}},
		})
		tpl.HasResourceProperties(jsii.String("AWS::SQS::Queue"), map[string]any{
			"RedrivePolicy":        map[string]any{"deadLetterTargetArn": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("^JobsQueue" + name + "DLQ")), "Arn"}}},
			"SqsManagedSseEnabled": true,
		})
		tpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"AlarmDescription": "nexjob: messages in the dead-letter queue of the named queue " + name,
		})
		// The producer sends to it.
		tpl.HasResourceProperties(jsii.String("AWS::IAM::Policy"), map[string]any{
			"Roles": []any{map[string]any{"Ref": assertions.Match_StringLikeRegexp(jsii.String("^Producer"))}},
			"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{
				"Action":   []any{"sqs:SendMessage", "sqs:GetQueueAttributes"},
				"Resource": map[string]any{"Fn::GetAtt": []any{assertions.Match_StringLikeRegexp(jsii.String("^JobsQueue" + name + "[0-9A-F]")), "Arn"}},
			})})},
		})
	}
	// Three event sources on the worker, three on the DLQ consumer, the stream.
	tpl.ResourceCountIs(jsii.String("AWS::Lambda::EventSourceMapping"), jsii.Number(7))
	env := *q.Settings(settings.Producer)
	if env[settings.EnvQueues] == nil {
		t.Fatalf("Settings(Producer) has no %s", settings.EnvQueues)
	}
	raw, _ := json.Marshal(tpl.ToJSON())
	if n := strings.Count(string(raw), `"`+settings.EnvQueues+`"`); n < 3 {
		t.Fatalf("%s is set on %d functions, want every one (3)", settings.EnvQueues, n)
	}
}

// oneBinaryStack is a stack of its own and one placeholder bootstrap for
// every function.
func oneBinaryStack(t *testing.T, name string) (awscdk.Stack, awslambda.Code) {
	t.Helper()
	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	return awscdk.NewStack(app, jsii.String(name), nil), infra.BootstrapCode(code)
}
