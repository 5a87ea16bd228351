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
	"github.com/nexjob/nexjob-aws/idempotency/powertools"
	"github.com/nexjob/nexjob-aws/infra"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// GrantPowertoolsIdempotency grants exactly what the Go store in
// Powertools' layout calls on the nexjob table (a first call, a repeat,
// an error's release, a waiting repeat's read), every request on a key
// under "payments#", and its DynamoDB grant is limited to that prefix;
// a prefix that would widen it panics.
func TestPowertoolsGrantExactlyItsCalls(t *testing.T) {
	e := nexjobtest.New(t, nil)
	rec := newRecorder(t, os.Getenv("AWS_ENDPOINT_URL"))
	cfg := e.Cfg.Copy()
	cfg.BaseEndpoint = aws.String(rec.url("powertools"))
	var mu sync.Mutex
	var keys []string
	ft := faults.New(nil)
	for _, op := range []string{"GetItem", "PutItem", "UpdateItem", "DeleteItem"} {
		ft.Add(faults.Rule{Op: "DynamoDB." + op, Fault: faults.Pass, Times: faults.Forever, Before: func(_ *http.Request, body []byte) {
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
	b, err := powertools.New(cfg, &powertools.Options{Table: e.Table, KeyPrefix: "payments", KeyAttr: ledger.AttrPK, ExpiryAttr: ledger.TTLAttribute})
	if err != nil {
		t.Fatal(err)
	}
	s, err := idempotency.New(cfg, "", &idempotency.Options{Backend: b, Function: "payments", Wait: true})
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
	if _, _, err := b.GetCall(ctx, s.KeyHash("a")); err != nil { // what a waiting repeat reads
		t.Fatal(err)
	}
	called := rec.calls("powertools")
	mu.Lock()
	for _, k := range keys {
		if !strings.HasPrefix(k, "payments#") {
			t.Errorf("a request on key %q, outside payments#", k)
		}
	}
	mu.Unlock()

	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("Shared"), nil)
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{Code: infra.BootstrapCode(code)})
	fn := awslambda.NewFunction(stack, jsii.String("Charge"), &awslambda.FunctionProps{
		Runtime: awslambda.Runtime_PROVIDED_AL2023(), Handler: jsii.String("bootstrap"), Code: infra.BootstrapCode(code),
	})
	q.GrantPowertoolsIdempotency(fn, "payments")
	for _, bad := range []string{"p", "pay#ments", "pay*", ""} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("GrantPowertoolsIdempotency(%q) did not panic", bad)
				}
			}()
			q.GrantPowertoolsIdempotency(fn, bad)
		}()
	}
	var doc map[string]any
	raw, _ := json.Marshal(assertions.Template_FromStack(stack, nil).ToJSON())
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	resources := doc["Resources"].(map[string]any)
	var role any
	for _, res := range resources {
		if r := res.(map[string]any); r["Type"] == "AWS::Lambda::Function" && strings.Contains(jsonOf(r), "Charge") {
			role = r["Properties"].(map[string]any)["Role"]
		}
	}
	if role == nil {
		t.Fatal("no Charge function")
	}
	granted := policyOf(resources, role)
	for _, c := range called {
		if !granted.allows(c) {
			t.Errorf("the store calls %s, not granted", c)
		}
	}
	for a := range granted {
		if !strings.HasPrefix(a, "logs:") && !slices.Contains(called, a) {
			t.Errorf("granted %s, which no path calls (called %v)", a, called)
		}
	}
	for _, st := range statementsOf(resources, role) {
		if strings.HasPrefix(st.actions[0], "dynamodb:") && !strings.Contains(st.condition, `"dynamodb:LeadingKeys":["payments#*"]`) {
			t.Errorf("a DynamoDB grant not limited to payments#: %v %s", st.actions, st.condition)
		}
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
