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
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/infra"
)

// logicalID is the template's resource of type typ whose logical ID
// starts with prefix.
func logicalID(t *testing.T, resources map[string]any, typ, prefix string) string {
	t.Helper()
	for id, res := range resources {
		if strings.HasPrefix(id, prefix) && res.(map[string]any)["Type"] == typ {
			return id
		}
	}
	t.Fatalf("no %s %s… in the template", typ, prefix)
	return ""
}

// roleRef is a role as a function's Role property names it.
func roleRef(id string) any { return map[string]any{"Fn::GetAtt": []any{id, "Arn"}} }

// TestSchedulerTargetsHaveTheDLQ (issue 27 item 21): both roles
// Scheduler assumes (far jobs' FarScheduleRole, recurring jobs'
// SchedulerRole) may send to the job queue's DLQ, which their schedules'
// targets name (NEXJOB_SCHEDULE_DLQ_ARN, given to every function that
// makes schedules: the producer's settings, the worker, the DLQ consumer,
// the guard). Without it Scheduler dropped a message SQS refused for 24
// hours, and the far job waited for good.
func TestSchedulerTargetsHaveTheDLQ(t *testing.T) {
	doc := allOptions(t, "/nexjob/dlq-test/key-secret")
	resources := doc["Resources"].(map[string]any)
	dlq := logicalID(t, resources, "AWS::SQS::Queue", "JobsDLQ")
	wantDLQ, _ := json.Marshal(map[string]any{"Fn::GetAtt": []any{dlq, "Arn"}})
	for _, role := range []string{"JobsFarScheduleRole", "JobsSchedulerRole"} {
		sends := policyOf(resources, roleRef(logicalID(t, resources, "AWS::IAM::Role", role)))["sqs:SendMessage"]
		if !strings.Contains(strings.Join(sends, " "), string(wantDLQ)) {
			t.Errorf("%s may send to %v, not to the DLQ its schedules' targets name", role, sends)
		}
	}
	for id, res := range resources {
		r := res.(map[string]any)
		if r["Type"] != "AWS::Lambda::Function" {
			continue
		}
		vars := r["Properties"].(map[string]any)["Environment"].(map[string]any)["Variables"].(map[string]any)
		switch vars["NEXJOB_ROLE"] {
		case "worker", "deadletter", "guard", "dashboard", "recurring":
			got, _ := json.Marshal(vars["NEXJOB_SCHEDULE_DLQ_ARN"])
			if string(got) != string(wantDLQ) {
				t.Errorf("%s (%v): NEXJOB_SCHEDULE_DLQ_ARN is %s, want the DLQ's ARN %s", id, vars["NEXJOB_ROLE"], got, wantDLQ)
			}
		}
	}
}

// TestFarAndRecurringSchedulesApart (issue 27 item 22): far jobs'
// one-time schedules have a group of their own. GrantSchedule (recurring
// jobs) could update and delete every far job's schedule in the shared
// group (losing those jobs), and every far grantee could rewrite the
// recurring schedules whose id starts with "nj". Now GrantSchedule and
// GrantRead's GetSchedule name the recurring group only, the far grants
// the far group's nj-… schedules only, and the settings name both.
func TestFarAndRecurringSchedulesApart(t *testing.T) {
	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Apart"), nil)
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code), Recurring: jsii.Bool(true),
		WebDashboard: &infra.WebDashboardProps{Write: jsii.Bool(true)}})
	ops := awsiam.NewRole(stack, jsii.String("Ops"), &awsiam.RoleProps{AssumedBy: awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil)})
	q.GrantSchedule(ops)
	producer := awsiam.NewRole(stack, jsii.String("Producer"), &awsiam.RoleProps{AssumedBy: awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil)})
	q.GrantEnqueue(producer)
	var doc map[string]any
	b, _ := json.Marshal(assertions.Template_FromStack(stack, nil).ToJSON())
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	resources := doc["Resources"].(map[string]any)
	var groups []string
	for id, res := range resources {
		if res.(map[string]any)["Type"] == "AWS::Scheduler::ScheduleGroup" {
			groups = append(groups, id)
		}
	}
	if len(groups) != 2 {
		t.Fatalf("%d schedule groups %v, want 2: the recurring jobs' and the far jobs'", len(groups), groups)
	}
	rec := logicalID(t, resources, "AWS::Scheduler::ScheduleGroup", "JobsSchedules")
	far := logicalID(t, resources, "AWS::Scheduler::ScheduleGroup", "JobsFarSchedules")
	// A group appears by its logical ID (Ref, GetAtt) or by its name.
	name := func(id string) string {
		return resources[id].(map[string]any)["Properties"].(map[string]any)["Name"].(string)
	}
	names := func(s, id string) bool {
		return strings.Contains(s, id) || strings.Contains(s, `"`+name(id)) || strings.Contains(s, "/"+name(id)+"/")
	}
	scheduler := func(role any) map[string]string { // Scheduler action → its resources, as JSON
		out := map[string]string{}
		for a, res := range policyOf(resources, role) {
			if strings.HasPrefix(a, "scheduler:") && a != "scheduler:ListSchedules" {
				out[a] = strings.Join(res, " ")
			}
		}
		return out
	}
	for a, res := range scheduler(roleRef(logicalID(t, resources, "AWS::IAM::Role", "Ops"))) {
		if names(res, far) || !names(res, rec) {
			t.Errorf("GrantSchedule's %s names %s: want the recurring jobs' group only", a, res)
		}
	}
	fnRole := func(role string) any {
		for _, res := range resources {
			r := res.(map[string]any)
			if r["Type"] == "AWS::Lambda::Function" && r["Properties"].(map[string]any)["Environment"].(map[string]any)["Variables"].(map[string]any)["NEXJOB_ROLE"] == role {
				return r["Properties"].(map[string]any)["Role"]
			}
		}
		t.Fatalf("no %s function", role)
		return nil
	}
	farGrantees := map[string]any{"producer": roleRef(logicalID(t, resources, "AWS::IAM::Role", "Producer")),
		"worker": fnRole("worker"), "deadletter": fnRole("deadletter"), "guard": fnRole("guard")}
	for name, role := range farGrantees {
		got := scheduler(role)
		if len(got) == 0 {
			t.Errorf("%s has no far schedule grants", name)
		}
		for a, res := range got {
			if names(res, rec) || !names(res, far) || !strings.Contains(res, "/nj-*") {
				t.Errorf("%s's %s names %s: want the far group's nj-* schedules only", name, a, res)
			}
		}
	}
	// The dashboard reads (GetSchedule) the recurring group; its far
	// grants (cancel, delete) are the far group's.
	for a, res := range scheduler(fnRole("dashboard")) {
		if a == "scheduler:GetSchedule" && (names(res, far) || !names(res, rec)) {
			t.Errorf("the dashboard's GetSchedule names %s: want the recurring group's", res)
		}
		if a != "scheduler:GetSchedule" && (names(res, rec) || !names(res, far)) {
			t.Errorf("the dashboard's %s names %s: want the far group's", a, res)
		}
	}
	env := *q.Settings("producer")
	for k, want := range map[string]string{"NEXJOB_FAR_SCHEDULE_GROUP": far, "NEXJOB_SCHEDULE_GROUP": rec} {
		var got []byte
		if env[k] != nil {
			got, _ = json.Marshal(stack.Resolve(env[k]))
		}
		if !names(string(got), want) {
			t.Errorf("the producer's %s is %s, want %s", k, got, want)
		}
	}
}
