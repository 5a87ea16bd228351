package infra_test

import (
	"encoding/json"
	"strings"
	"testing"
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
