package settings_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/settings"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

var region = aws.Config{Region: "eu-west-1"}

func TestMissingAndInvalid(t *testing.T) {
	base := map[string]string{settings.EnvTable: "jobs", settings.EnvQueueURL: "https://sqs/q"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range base {
			m[a] = b
		}
		m[k] = v
		return m
	}
	for _, tc := range []struct {
		name string
		cfg  aws.Config
		role settings.Role
		env  map[string]string
		want string // the variable the error names
	}{
		{"no table", region, settings.Worker, map[string]string{settings.EnvQueueURL: "q"}, settings.EnvTable},
		{"no queue", region, settings.Producer, map[string]string{settings.EnvTable: "t"}, settings.EnvQueueURL},
		{"guard needs only the queue", region, settings.Guard, map[string]string{}, settings.EnvQueueURL},
		{"retention", region, settings.Worker, with(settings.EnvRetention, "failed=forever"), settings.EnvRetention},
		{"retention outcome", region, settings.Worker, with(settings.EnvRetention, "done=1h"), settings.EnvRetention},
		{"index", region, settings.Worker, with(settings.EnvIndexAllStates, "yes please"), settings.EnvIndexAllStates},
		{"guard after", region, settings.Guard, with(settings.EnvGuardAfter, "soon"), settings.EnvGuardAfter},
		{"two secrets", region, settings.Producer, with(settings.EnvKeySecretParameter, "/p"), ""},
		{"role", region, settings.Role("cron"), base, settings.EnvRole},
		{"queues json", region, settings.Producer, with(settings.EnvQueues, "bulk=https://sqs/b"), settings.EnvQueues},
		{"queue name", region, settings.Producer, with(settings.EnvQueues, `{"bulk imports":{"url":"https://sqs/b"}}`), settings.EnvQueues},
		{"queue url", region, settings.Worker, with(settings.EnvQueues, `{"bulk":{"dlq":"https://sqs/b-dlq"}}`), settings.EnvQueues},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.env
			if tc.name == "two secrets" {
				e[settings.EnvKeySecret] = "s3cret"
			}
			_, err := settings.FromEnv(context.Background(), tc.cfg, tc.role, env(e))
			var me *settings.MissingError
			var ie *settings.InvalidError
			switch {
			case errors.As(err, &me) && me.Var == tc.want:
			case errors.As(err, &ie) && (ie.Var == tc.want || tc.want == ""):
			default:
				t.Fatalf("got %v, want an error naming %s", err, tc.want)
			}
			if e[settings.EnvKeySecret] != "" && strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
	if _, err := settings.FromEnv(context.Background(), aws.Config{}, settings.Worker, env(base)); !errors.Is(err, settings.ErrNoRegion) {
		t.Fatalf("no region: %v", err)
	}
}

func TestValues(t *testing.T) {
	s, err := settings.FromEnv(context.Background(), region, settings.Worker, env(map[string]string{
		settings.EnvTable: "jobs", settings.EnvQueueURL: "q", settings.EnvDLQURL: "dlq",
		settings.EnvRetention: "failed=90d, succeeded=1h", settings.EnvIndexAllStates: "true", settings.EnvKeySecret: "k",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := handler.Retention{Succeeded: time.Hour, Failed: 90 * 24 * time.Hour, Expired: handler.DefaultRetention.Expired}
	if s.Retention != want || !s.IndexAllStates || string(s.KeySecret) != "k" || s.DLQURL != "dlq" {
		t.Fatalf("%+v", s)
	}
	if s.QueueURLs() != nil {
		t.Fatalf("no NEXJOB_QUEUES: queues %v", s.QueueURLs())
	}
	o := s.HandlerOptions(&handler.Options{Concurrency: 3})
	if o.Concurrency != 3 || o.DLQURL != "dlq" || *o.Retention != want || !o.Ledger.IndexAllStates || string(o.Ledger.KeySecret) != "k" {
		t.Fatalf("handler options %+v", o)
	}
	if c := s.ClientOptions(); c.Retention == nil || *c.Retention != want {
		t.Fatalf("client options' retention %v, want %+v (a continuation the producer ends is kept as long)", c.Retention, want)
	}
	back, err := settings.ParseRetention(settings.FormatRetention(want))
	if err != nil || back != want {
		t.Fatalf("round trip: %+v %v", back, err)
	}
}

// TestNamedQueues: NEXJOB_QUEUES reaches the enqueue client, the handler
// and the far jobs' schedules; with far jobs on, a named queue needs its
// ARN (the schedules' target).
func TestNamedQueues(t *testing.T) {
	vars := map[string]string{
		settings.EnvTable: "jobs", settings.EnvQueueURL: "https://sqs/q",
		settings.EnvQueues:  `{"bulk":{"url":"https://sqs/b","arn":"arn:aws:sqs:eu-west-1:1:b","dlq":"https://sqs/b-dlq"}}`,
		settings.EnvFarRole: "arn:aws:iam::1:role/far", settings.EnvFarScheduleGroup: "far", settings.EnvQueueARN: "arn:aws:sqs:eu-west-1:1:q",
		settings.EnvScheduleDLQARN: "arn:aws:sqs:eu-west-1:1:dlq",
	}
	s, err := settings.FromEnv(context.Background(), region, settings.Producer, env(vars))
	if err != nil {
		t.Fatal(err)
	}
	if s.Queues["bulk"].DLQURL != "https://sqs/b-dlq" || s.ClientOptions().Queues["bulk"] != "https://sqs/b" ||
		s.HandlerOptions(nil).Queues["bulk"] != "https://sqs/b" || s.Far.QueueARNs["bulk"] != "arn:aws:sqs:eu-west-1:1:b" {
		t.Fatalf("%+v", s)
	}
	none := map[string]string{settings.EnvTable: "jobs", settings.EnvQueueURL: "https://sqs/q", settings.EnvQueues: "{}"}
	if s, err := settings.FromEnv(context.Background(), region, settings.Worker, env(none)); err != nil || s.QueueURLs() != nil {
		t.Fatalf(`NEXJOB_QUEUES "{}" (the construct's with none): %v %v, want no named queues`, s.QueueURLs(), err)
	}
	vars[settings.EnvQueues] = `{"bulk":{"url":"https://sqs/b"}}`
	var ie *settings.InvalidError
	if _, err := settings.FromEnv(context.Background(), region, settings.Producer, env(vars)); !errors.As(err, &ie) || ie.Var != settings.EnvQueues {
		t.Fatalf("far jobs and a queue without its ARN: %v, want an InvalidError on %s", err, settings.EnvQueues)
	}
}

// TestKeySecretFromSSM reads the key secret from a SecureString parameter
// on the emulator; producers and workers reading it hash keys alike.
func TestKeySecretFromSSM(t *testing.T) {
	cfg := nexjobtest.Config(t)
	name := "/nexjob/test/key-secret-" + time.Now().Format("150405.000000")
	client := ssm.NewFromConfig(cfg)
	if _, err := client.PutParameter(context.Background(), &ssm.PutParameterInput{Name: aws.String(name), Value: aws.String("from-ssm"), Type: ssmtypes.ParameterTypeSecureString}); err != nil {
		t.Fatal(err)
	}
	e := env(map[string]string{settings.EnvTable: "t", settings.EnvQueueURL: "q", settings.EnvKeySecretParameter: name})
	s, err := settings.FromEnv(context.Background(), cfg, settings.Producer, e)
	if err != nil || string(s.KeySecret) != "from-ssm" {
		t.Fatalf("%q %v", s.KeySecret, err)
	}
	e = env(map[string]string{settings.EnvTable: "t", settings.EnvQueueURL: "q", settings.EnvKeySecretParameter: name + "-missing"})
	if _, err := settings.FromEnv(context.Background(), cfg, settings.Producer, e); err == nil || !strings.Contains(err.Error(), settings.EnvKeySecretParameter) {
		t.Fatalf("missing parameter: %v", err)
	}
}

// TestShardCountAboveTheDefaultIsRecorded: a writing role loaded with
// NEXJOB_INDEX_SHARDS above the default records it in the table (so a
// later deployment with fewer shards lists every entry this one writes);
// the guard and a read-only dashboard write nothing.
func TestShardCountAboveTheDefaultIsRecorded(t *testing.T) {
	e := nexjobtest.New(t, nil)
	vars := map[string]string{settings.EnvTable: e.Table, settings.EnvQueueURL: e.QueueURL, settings.EnvIndexShards: "40"}
	for _, role := range []settings.Role{settings.Guard, settings.Dashboard} {
		if _, err := settings.FromEnv(context.Background(), e.Cfg, role, env(vars)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(e.Scan(t)); n != 0 {
		t.Fatalf("the guard and a read-only dashboard wrote %d items", n)
	}
	if _, err := settings.FromEnv(context.Background(), e.Cfg, settings.Producer, env(vars)); err != nil {
		t.Fatal(err)
	}
	out, err := e.DB.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(e.Table),
		Key: map[string]types.AttributeValue{ledger.AttrPK: &types.AttributeValueMemberS{Value: "x#index"}}})
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := out.Item[ledger.AttrMaxShards].(*types.AttributeValueMemberN); !ok || n.Value != "40" {
		t.Fatalf("index item %v, want maxShards 40", out.Item)
	}
}

// TestFarSchedulesNeedADeadLetterQueue (issue 27 item 21): far jobs'
// schedules need NEXJOB_SCHEDULE_DLQ_ARN (without one Scheduler drops a
// message SQS refused for 24 hours, and the job waits for good); it goes
// to the far and the recurring schedules' targets.
func TestFarSchedulesNeedADeadLetterQueue(t *testing.T) {
	vars := map[string]string{
		settings.EnvTable: "jobs", settings.EnvQueueURL: "https://sqs/q",
		settings.EnvFarRole: "arn:aws:iam::1:role/far", settings.EnvFarScheduleGroup: "far", settings.EnvQueueARN: "arn:aws:sqs:eu-west-1:1:q",
	}
	var ie *settings.InvalidError
	if _, err := settings.FromEnv(context.Background(), region, settings.Producer, env(vars)); !errors.As(err, &ie) || !strings.Contains(ie.Reason, settings.EnvScheduleDLQARN) {
		t.Fatalf("far jobs with no DLQ for their schedules: %v, want an InvalidError naming %s", err, settings.EnvScheduleDLQARN)
	}
	vars[settings.EnvScheduleDLQARN] = "arn:aws:sqs:eu-west-1:1:dlq"
	s, err := settings.FromEnv(context.Background(), region, settings.Producer, env(vars))
	if err != nil || s.Far.DeadLetterARN != vars[settings.EnvScheduleDLQARN] || s.Schedules.DeadLetterARN != vars[settings.EnvScheduleDLQARN] {
		t.Fatalf("%+v %v", s, err)
	}
}

// TestFarSchedulesHaveTheirOwnGroup (issue 27 item 22): far jobs'
// schedules are in NEXJOB_FAR_SCHEDULE_GROUP, which may not be the
// recurring jobs' NEXJOB_SCHEDULE_GROUP.
func TestFarSchedulesHaveTheirOwnGroup(t *testing.T) {
	vars := map[string]string{
		settings.EnvTable: "jobs", settings.EnvQueueURL: "https://sqs/q", settings.EnvScheduleGroup: "rec",
		settings.EnvFarRole: "arn:aws:iam::1:role/far", settings.EnvQueueARN: "arn:aws:sqs:eu-west-1:1:q", settings.EnvScheduleDLQARN: "arn:aws:sqs:eu-west-1:1:dlq",
	}
	var ie *settings.InvalidError
	if _, err := settings.FromEnv(context.Background(), region, settings.Producer, env(vars)); !errors.As(err, &ie) || !strings.Contains(ie.Reason, settings.EnvFarScheduleGroup) {
		t.Fatalf("far jobs with no group of their own: %v, want an InvalidError naming %s", err, settings.EnvFarScheduleGroup)
	}
	vars[settings.EnvFarScheduleGroup] = "rec"
	if _, err := settings.FromEnv(context.Background(), region, settings.Producer, env(vars)); !errors.As(err, &ie) || ie.Var != settings.EnvFarScheduleGroup {
		t.Fatalf("far jobs in the recurring jobs' group: %v, want an InvalidError on %s", err, settings.EnvFarScheduleGroup)
	}
	vars[settings.EnvFarScheduleGroup] = "far"
	s, err := settings.FromEnv(context.Background(), region, settings.Producer, env(vars))
	if err != nil || s.Far.Group != "far" || s.Schedules.Group != "rec" {
		t.Fatalf("%+v %v", s, err)
	}
}

// A read-only process the key secret is withheld from reads none (no
// SSM call: region only, no endpoint) and says so; a secret given to it
// anyway is a contradiction, refused.
func TestKeySecretWithheld(t *testing.T) {
	base := map[string]string{settings.EnvTable: "jobs", settings.EnvQueueURL: "q", settings.EnvKeySecretWithheld: "true"}
	s, err := settings.FromEnv(context.Background(), region, settings.Dashboard, env(base))
	if err != nil || !s.KeySecretWithheld || s.KeySecret != nil {
		t.Fatalf("withheld: %+v %v", s, err)
	}
	for _, v := range []string{settings.EnvKeySecret, settings.EnvKeySecretParameter} {
		e := map[string]string{v: "/x"}
		for k, x := range base {
			e[k] = x
		}
		var inv *settings.InvalidError
		if _, err := settings.FromEnv(context.Background(), region, settings.Dashboard, env(e)); !errors.As(err, &inv) || inv.Var != settings.EnvKeySecretWithheld {
			t.Errorf("withheld with %s set: %v, want an *InvalidError on %s", v, err, settings.EnvKeySecretWithheld)
		}
	}
}
