// deploy/payments_run_test.go: written beside docs/idempotency.md's own
// deploy/payments.go by TestIdempotencyBlocksRun (internal/proof/docs):
// Wire, run on a synthesised stack, gives the function what
// idempotency.New reads (the table, the key secret's parameter and its
// name) and a grant on its own call records only; wiring it again changes
// nothing.
package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/infra"
	"github.com/nexjob/nexjob-aws/settings"
)

func TestWireGivesTheSettingsAndTheGrant(t *testing.T) {
	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Payments"), nil)
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code), KeySecretParameter: jsii.String("/nexjob/payments/key-secret")})
	fn := awslambda.NewFunction(stack, jsii.String("Pay"), &awslambda.FunctionProps{
		Runtime: awslambda.Runtime_PROVIDED_AL2023(), Handler: jsii.String("bootstrap"), Code: infra.BootstrapCode(code),
	})
	template := func() map[string]any {
		var doc map[string]any
		b, _ := json.Marshal(assertions.Template_FromStack(stack, nil).ToJSON())
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		return doc["Resources"].(map[string]any)
	}
	Wire(q, fn)
	first, _ := json.Marshal(template())
	var env map[string]any
	var roleID string
	resources := template()
	for _, res := range resources {
		r := res.(map[string]any)
		props, _ := r["Properties"].(map[string]any)
		if r["Type"] != "AWS::Lambda::Function" || props["Handler"] != "bootstrap" || props["Environment"] == nil {
			continue
		}
		vars := props["Environment"].(map[string]any)["Variables"].(map[string]any)
		if vars[settings.EnvRole] == string(settings.Idempotent) {
			env, roleID = vars, props["Role"].(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
		}
	}
	if env == nil || env[settings.EnvTable] == nil || env[settings.EnvKeySecretParameter] != "/nexjob/payments/key-secret" || env["NEXJOB_IDEMPOTENCY_FUNCTION"] != "payments" {
		t.Fatalf("the wired function's environment: %v; want the table, the key secret's parameter and its name", env)
	}
	leading := false
	for _, res := range resources {
		r := res.(map[string]any)
		if r["Type"] != "AWS::IAM::Policy" {
			continue
		}
		b, _ := json.Marshal(r["Properties"])
		if strings.Contains(string(b), `"Ref":"`+roleID+`"`) && strings.Contains(string(b), `"dynamodb:LeadingKeys":["i#payments#*"]`) {
			leading = true
		}
	}
	if !leading {
		t.Fatal("no grant on the function's own call records (i#payments#*) for the wired function")
	}
	Wire(q, fn) // the repeat: the same environment; the grant's statements are merged
	again, _ := json.Marshal(template())
	if string(again) != string(first) {
		t.Errorf("wiring twice changed the stack:\n%s\n%s", first, again)
	}
}
