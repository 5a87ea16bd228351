package infra_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/infra"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/settings"
)

// TestIdempotencyGrantsExactlyItsCalls runs every path of package
// idempotency (a first call, a repeat, a released error, a waiting
// repeat's read) through the recording proxy, and compares the AWS
// actions called with the policy GrantIdempotency writes: each call
// granted, nothing granted that no path calls, every grant limited to
// call records (dynamodb:LeadingKeys), and every request's key one.
// The function's environment names the table and nothing of the jobs.
func TestIdempotencyGrantsExactlyItsCalls(t *testing.T) {
	e := nexjobtest.New(t, nil)
	rec := newRecorder(t, os.Getenv("AWS_ENDPOINT_URL"))
	cfg := e.Cfg.Copy()
	cfg.BaseEndpoint = aws.String(rec.url("idempotent"))
	var mu sync.Mutex
	var keys []string
	ft := faults.New(nil)
	read := make(chan struct{})
	readOnce := sync.OnceFunc(func() { close(read) })
	for _, op := range []string{"GetItem", "PutItem", "UpdateItem", "DeleteItem"} {
		ft.Add(faults.Rule{Op: "DynamoDB." + op, Fault: faults.Pass, Times: faults.Forever, Before: func(_ *http.Request, body []byte) {
			if op == "GetItem" {
				defer readOnce()
			}
			var in struct{ Key, Item map[string]map[string]string }
			_ = json.Unmarshal(body, &in)
			mu.Lock()
			defer mu.Unlock()
			if in.Key != nil {
				keys = append(keys, in.Key["pk"]["S"])
			} else {
				keys = append(keys, in.Item["pk"]["S"])
			}
		}})
	}
	cfg = faults.Config(cfg, ft)
	s, err := idempotency.New(cfg, e.Table, &idempotency.Options{Wait: true, Function: "charge"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ok := func(context.Context) (int, error) { return 1, nil }
	if _, err := idempotency.Do(ctx, s, "a", ok, nil); err != nil {
		t.Fatal(err)
	}
	if res, err := idempotency.Do(ctx, s, "a", ok, nil); err != nil || !res.Replayed {
		t.Fatalf("repeat: %+v %v", res, err)
	}
	if _, err := idempotency.Do(ctx, s, "b", func(context.Context) (int, error) { return 0, errors.New("no") }, nil); err == nil {
		t.Fatal("want the error")
	}
	// A repeat that waits: it reads the first call's record.
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(ctx, s, "c", func(context.Context) (int, error) { close(started); <-release; return 3, nil }, nil)
		done <- err
	}()
	<-started
	waited := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(ctx, s, "c", ok, nil)
		waited <- err
	}()
	select {
	case <-read:
	case err := <-waited:
		t.Fatalf("the repeat returned before reading: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	called := rec.calls("idempotent")
	mu.Lock()
	for _, k := range keys {
		if !strings.HasPrefix(k, ledger.FunctionCallPrefix("charge")) {
			t.Errorf("a request on key %q, outside the function's call records", k)
		}
	}
	mu.Unlock()

	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Idem"), nil)
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code), KeySecretParameter: jsii.String("/nexjob/idem/key-secret")})
	fn := awslambda.NewFunction(stack, jsii.String("Charge"), &awslambda.FunctionProps{
		Runtime: awslambda.Runtime_PROVIDED_AL2023(), Handler: jsii.String("bootstrap"), Code: infra.BootstrapCode(code),
		Environment: q.Settings(settings.Idempotent),
	})
	q.GrantIdempotency(fn, "charge")
	var doc map[string]any
	b, _ := json.Marshal(assertions.Template_FromStack(stack, nil).ToJSON())
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	resources := doc["Resources"].(map[string]any)
	var role any
	var env map[string]any
	for _, res := range resources {
		r := res.(map[string]any)
		if r["Type"] != "AWS::Lambda::Function" {
			continue
		}
		props := r["Properties"].(map[string]any)
		if vars := props["Environment"].(map[string]any)["Variables"].(map[string]any); vars[settings.EnvRole] == string(settings.Idempotent) {
			role, env = props["Role"], vars
		}
	}
	if role == nil {
		t.Fatal("no function with the idempotent role's settings")
	}
	var names []string
	for k := range env {
		names = append(names, k)
	}
	slices.Sort(names)
	if want := []string{settings.EnvIdempotencyFunction, settings.EnvKeySecretParameter, settings.EnvRole, settings.EnvTable}; !slices.Equal(names, want) {
		t.Errorf("the function's environment: %v, want %v", names, want)
	}
	granted := policyOf(resources, role)
	for _, c := range called {
		if !granted.allows(c) {
			t.Errorf("the utility calls %s, not granted", c)
		}
	}
	for a := range granted {
		if strings.HasPrefix(a, "logs:") || a == "ssm:GetParameter" {
			continue // its logs; the key secret at start
		}
		if !slices.Contains(called, a) {
			t.Errorf("granted %s, which no path calls (called %v)", a, called)
		}
	}
	for _, st := range statementsOf(resources, role) {
		if !strings.HasPrefix(st.actions[0], "dynamodb:") {
			continue
		}
		if !strings.Contains(st.condition, `"dynamodb:LeadingKeys":["`+ledger.FunctionCallPrefix("charge")+`*"]`) {
			t.Errorf("a DynamoDB grant not limited to the function's call records: %v %s", st.actions, st.condition)
		}
	}
}

type statement struct {
	actions   []string
	condition string
}

// statementsOf returns the Allow statements of the policies attached to
// the function's role.
func statementsOf(resources map[string]any, fnRole any) []statement {
	roleID := fnRole.(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
	var out []statement
	for _, res := range resources {
		r := res.(map[string]any)
		if r["Type"] != "AWS::IAM::Policy" {
			continue
		}
		props := r["Properties"].(map[string]any)
		for _, ref := range props["Roles"].([]any) {
			if ref.(map[string]any)["Ref"] != roleID {
				continue
			}
			for _, st := range props["PolicyDocument"].(map[string]any)["Statement"].([]any) {
				if s := st.(map[string]any); s["Effect"] != "Deny" {
					cond, _ := json.Marshal(s["Condition"])
					out = append(out, statement{actions: toStrings(s["Action"]), condition: string(cond)})
				}
			}
		}
	}
	return out
}

// TestIdempotencyGrantIsTheFunctionsOwn synthesises two idempotent
// functions and reads each one's policy: every DynamoDB grant carries a
// dynamodb:LeadingKeys condition naming that function's prefix alone
// ("i#payments#*"), so one function can neither read nor write another's records (a second
// store of another name recorded first, or rewrote a stored receipt with
// one UpdateItem, when every function had "i#*"); the function is told
// its name (NEXJOB_IDEMPOTENCY_FUNCTION), which its store keeps to; a
// name that is no name (empty, or outside the kinds rule: "#" or "*"
// would widen the prefix) or a second name for one function panics.
func TestIdempotencyGrantIsTheFunctionsOwn(t *testing.T) {
	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Idem"), nil)
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code)})
	fn := func(id string) awslambda.Function {
		return awslambda.NewFunction(stack, jsii.String(id), &awslambda.FunctionProps{
			Runtime: awslambda.Runtime_PROVIDED_AL2023(), Handler: jsii.String("bootstrap"), Code: infra.BootstrapCode(code),
			Environment: q.Settings(settings.Idempotent),
		})
	}
	payments, refunds := fn("Payments"), fn("Refunds")
	q.GrantIdempotency(payments, "payments")
	q.GrantIdempotency(refunds, "refunds")
	q.GrantIdempotency(refunds, "refunds") // again: the same grant
	var doc map[string]any
	b, _ := json.Marshal(assertions.Template_FromStack(stack, nil).ToJSON())
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	resources := doc["Resources"].(map[string]any)
	for id, want := range map[string]string{
		"Payments": `["i#payments#*"]`,
		"Refunds":  `["i#refunds#*"]`,
	} {
		var role any
		var env map[string]any
		for rid, res := range resources {
			r := res.(map[string]any)
			if r["Type"] == "AWS::Lambda::Function" && strings.HasPrefix(rid, id) {
				props := r["Properties"].(map[string]any)
				role, env = props["Role"], props["Environment"].(map[string]any)["Variables"].(map[string]any)
			}
		}
		if role == nil {
			t.Fatalf("no function %s", id)
		}
		n := 0
		for _, st := range statementsOf(resources, role) {
			if !strings.HasPrefix(st.actions[0], "dynamodb:") {
				continue
			}
			n++
			var cond map[string]map[string]json.RawMessage
			_ = json.Unmarshal([]byte(st.condition), &cond)
			leading := string(cond["ForAllValues:StringLike"]["dynamodb:LeadingKeys"])
			if len(cond) != 1 || len(cond["ForAllValues:StringLike"]) != 1 || leading != want {
				t.Errorf("%s's DynamoDB grant %v: condition %s; want dynamodb:LeadingKeys %s alone (the function's own records)", id, st.actions, st.condition, want)
			}
		}
		if n == 0 {
			t.Errorf("%s has no DynamoDB grant", id)
		}
		got, _ := json.Marshal(env[settings.EnvIdempotencyFunction])
		if name := strings.ToLower(id); string(got) != `"`+name+`"` {
			t.Errorf("%s's %s: %s; want %q, the name its grant names", id, settings.EnvIdempotencyFunction, got, name)
		}
	}
	for _, name := range []string{"", "pay#ments", "pay*", "refunds"} {
		msg := panics(func() { q.GrantIdempotency(payments, name) })
		if msg == "" || !strings.Contains(msg, "GrantIdempotency") {
			t.Errorf("GrantIdempotency(payments, %q): panic %q; want one naming GrantIdempotency", name, msg)
		}
	}
}
