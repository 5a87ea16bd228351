package infra_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/infra"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/lambdamain"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/settings"
)

// startupChild is set in a child process of TestEveryRoleStartsWithItsGrants:
// it runs lambdamain.Serve (the role comes from NEXJOB_ROLE, as in Lambda)
// and exits 0 once the role's handler is built, or 1 from the role's own
// start-up failure.
const startupChild = "NEXJOB_INFRA_STARTUP_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(startupChild) == "1" {
		lambdamain.Serve(handler.NewRegistry(), &lambdamain.Options{Start: func(any) { os.Exit(0) }})
		os.Exit(3) // Serve returned without starting: never expected
	}
	os.Exit(nexjobtest.Main(m))
}

// allOptions synthesises a JobQueue with every option that adds a
// function or a setting: a key secret in SSM under a customer-managed
// key, the guard, a write dashboard and recurring jobs.
func allOptions(t *testing.T, param string) map[string]any {
	t.Helper()
	code := t.TempDir()
	if err := os.WriteFile(filepath.Join(code, "bootstrap"), []byte("placeholder"), 0o755); err != nil {
		t.Fatal(err)
	}
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(t.TempDir())})
	stack := awscdk.NewStack(app, jsii.String("All"), nil)
	key := awskms.NewKey(stack, jsii.String("SecretKey"), nil)
	q := infra.NewJobQueue(stack, "Jobs", &infra.JobQueueProps{
		Code: infra.BootstrapCode(code), KeySecretParameter: jsii.String(param), KeySecretKey: key,
		WebDashboard: &infra.WebDashboardProps{Write: jsii.Bool(true)}, Recurring: jsii.Bool(true),
	})
	producer := awsiam.NewRole(stack, jsii.String("Producer"), &awsiam.RoleProps{AssumedBy: awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil)})
	q.GrantEnqueue(producer)
	var doc map[string]any
	b, _ := json.Marshal(assertions.Template_FromStack(stack, nil).ToJSON())
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestEveryRoleStartsWithItsGrants synthesises the construct with every
// option on and starts each of its functions, as Lambda would, from the
// environment the template gives it (resources mapped to the emulator's),
// through a proxy that records every AWS action the start-up calls. Each
// function must start, and each action it called must be granted to its
// role in the template, on the resource it called it on. The guard was
// given the key secret's parameter but not the grant, and died at start.
func TestEveryRoleStartsWithItsGrants(t *testing.T) {
	e := nexjobtest.New(t, nil)
	param := "/nexjob/" + e.Table + "/key-secret"
	if _, err := ssm.NewFromConfig(e.Cfg).PutParameter(context.Background(), &ssm.PutParameterInput{
		Name: aws.String(param), Value: aws.String("s3cret-key-material"), Type: ssmtypes.ParameterTypeSecureString,
	}); err != nil {
		t.Fatal(err)
	}
	doc := allOptions(t, param)
	resources := doc["Resources"].(map[string]any)

	rec := newRecorder(t, os.Getenv("AWS_ENDPOINT_URL"))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]bool{}
	for id, res := range resources {
		r := res.(map[string]any)
		if r["Type"] != "AWS::Lambda::Function" {
			continue
		}
		props := r["Properties"].(map[string]any)
		vars := props["Environment"].(map[string]any)["Variables"].(map[string]any)
		role, _ := vars[settings.EnvRole].(string)
		roles[role] = true
		t.Run(role, func(t *testing.T) {
			cmd := exec.Command(self, "-test.run=^$")
			cmd.Env = append(os.Environ(), startupChild+"=1", "AWS_ENDPOINT_URL="+rec.url(role))
			for k, v := range vars {
				cmd.Env = append(cmd.Env, k+"="+resolve(t, e, k, v))
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("function %s (%s) did not start: %v\n%s", id, role, err, out)
			}
			granted := policyOf(resources, props["Role"])
			for _, call := range rec.calls(role) {
				if !granted.allows(call) {
					t.Errorf("function %s (%s) calls %s at start, not granted; its policy: %v", id, role, call, granted)
				}
			}
			for a, res := range granted {
				if strings.HasPrefix(a, "ssm:") && (a != "ssm:GetParameter" || !strings.Contains(fmt.Sprint(res), strings.TrimPrefix(param, "/"))) {
					t.Errorf("%s: SSM grant beyond GetParameter on the key secret: %s on %v", role, a, res)
				}
			}
			if settings.NeedsKeySecret(settings.Role(role)) {
				if !slices.Contains(rec.calls(role), "ssm:GetParameter") {
					t.Errorf("%s: did not read the key secret at start: %v", role, rec.calls(role))
				}
				if !granted.allows("kms:Decrypt") {
					t.Errorf("%s reads a parameter under a customer-managed key without kms:Decrypt", role)
				}
			} else if _, ok := vars[settings.EnvKeySecretParameter]; ok || granted.allows("ssm:GetParameter") {
				t.Errorf("%s does not hash keys, yet is given the key secret (env %v, grant %v)", role, ok, granted.allows("ssm:GetParameter"))
			}
		})
	}
	for _, want := range []string{"worker", "deadletter", "guard", "dashboard", "recurring"} {
		if !roles[want] {
			t.Errorf("no %s function in the all-options stack: %v", want, roles)
		}
	}
}

// resolve turns a template value into what the function sees: literals
// as they are; the construct's own resources (tokens) by the variable
// they fill, mapped to this test's emulator resources.
func resolve(t *testing.T, e *nexjobtest.Env, name string, v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	switch name {
	case settings.EnvTable:
		return e.Table
	case settings.EnvQueueURL:
		return e.QueueURL
	case settings.EnvDLQURL:
		return e.DLQURL
	case settings.EnvScheduleGroup, settings.EnvScheduleTarget, settings.EnvSchedulerRole, settings.EnvFarRole, settings.EnvQueueARN, settings.EnvScheduleDLQARN:
		return "from-the-template:" + name // read at start, used only when a schedule is made
	}
	t.Fatalf("%s: a token the test cannot map: %v", name, v)
	return ""
}

// grants is one role's allowed actions, each with the resources it names.
type grants map[string][]string

func (g grants) allows(action string) bool {
	for a := range g {
		if a == action || (strings.HasSuffix(a, "*") && strings.HasPrefix(action, strings.TrimSuffix(a, "*"))) {
			return true
		}
	}
	return false
}

// policyOf collects the statements of every AWS::IAM::Policy attached to
// the role (a {"Fn::GetAtt": [roleID, "Arn"]} in the function's props).
func policyOf(resources map[string]any, fnRole any) grants {
	roleID := fnRole.(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
	g := grants{}
	for _, res := range resources {
		r := res.(map[string]any)
		if r["Type"] != "AWS::IAM::Policy" {
			continue
		}
		props := r["Properties"].(map[string]any)
		attached := false
		for _, ref := range props["Roles"].([]any) {
			if ref.(map[string]any)["Ref"] == roleID {
				attached = true
			}
		}
		if !attached {
			continue
		}
		for _, st := range props["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			s := st.(map[string]any)
			if s["Effect"] == "Deny" {
				continue // denies grant nothing (deniesOf reads them)
			}
			res, _ := json.Marshal(s["Resource"])
			for _, a := range toStrings(s["Action"]) {
				g[a] = append(g[a], string(res))
			}
		}
	}
	return g
}

// deniesOf collects the Deny statements attached to the role, each as
// its action and its condition (JSON).
func deniesOf(resources map[string]any, fnRole any) map[string]string {
	roleID := fnRole.(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
	out := map[string]string{}
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
				if s := st.(map[string]any); s["Effect"] == "Deny" {
					cond, _ := json.Marshal(s["Condition"])
					for _, a := range toStrings(s["Action"]) {
						out[a] = string(cond)
					}
				}
			}
		}
	}
	return out
}

// recorder is a reverse proxy to the emulator that records the IAM action
// of each request, per role (the path's first segment names the role),
// and the attribute names each DynamoDB UpdateItem names.
type recorder struct {
	srv     *httptest.Server
	mu      sync.Mutex
	got     map[string][]string
	updated map[string]map[string]bool // role → attribute names its UpdateItems named
}

func newRecorder(t *testing.T, backend string) *recorder {
	u, err := url.Parse(backend)
	if err != nil || backend == "" {
		t.Fatalf("no emulator endpoint: %q", backend)
	}
	r := &recorder{got: map[string][]string{}, updated: map[string]map[string]bool{}}
	proxy := httputil.NewSingleHostReverseProxy(u)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		role, rest, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/"), "/")
		req.URL.Path = "/" + rest
		act := action(req)
		var names []string
		if act == "dynamodb:UpdateItem" {
			body, _ := io.ReadAll(req.Body)
			req.Body = io.NopCloser(bytes.NewReader(body))
			names = attributeNames(body)
		}
		r.mu.Lock()
		r.got[role] = append(r.got[role], act)
		if r.updated[role] == nil {
			r.updated[role] = map[string]bool{}
		}
		for _, n := range names {
			r.updated[role][n] = true
		}
		r.mu.Unlock()
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// attributeNames are the attribute names an UpdateItem request names, as
// IAM's dynamodb:Attributes sees them at most: its key, the names behind
// its placeholders, and any bare word of its expressions.
func attributeNames(body []byte) []string {
	var in struct {
		Key                      map[string]any
		ExpressionAttributeNames map[string]string
		UpdateExpression         string
		ConditionExpression      string
	}
	_ = json.Unmarshal(body, &in)
	var out []string
	for k := range in.Key {
		out = append(out, k)
	}
	for _, n := range in.ExpressionAttributeNames {
		out = append(out, n)
	}
	name := func(r rune) bool {
		return r == '_' || r == '#' || r == ':' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
	}
	for _, w := range strings.FieldsFunc(in.UpdateExpression+" "+in.ConditionExpression, func(r rune) bool { return !name(r) }) {
		if !strings.HasPrefix(w, "#") && !strings.HasPrefix(w, ":") {
			out = append(out, w) // a bare name (or a keyword or function: harmless here)
		}
	}
	return out
}

// url is the endpoint one role's process is given. The SDK signs the
// path it is given, and the proxy strips the role before forwarding; the
// emulator does not check signatures.
func (r *recorder) url(role string) string { return r.srv.URL + "/" + role }

func (r *recorder) calls(role string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.got[role])
	sort.Strings(out)
	return slices.Compact(out)
}

// action names a request's IAM action from its operation as the fault
// transport names it ("DynamoDB.GetItem", "SSM.GetParameter",
// "SQS.SendMessage", "Scheduler.CreateSchedule"); anything else is
// recorded as unknown, which no policy allows.
func action(req *http.Request) string {
	svc, op, ok := strings.Cut(faults.Operation(req), ".")
	prefix := map[string]string{"DynamoDB": "dynamodb", "SSM": "ssm", "SQS": "sqs", "Scheduler": "scheduler"}[svc]
	if !ok || prefix == "" {
		return fmt.Sprintf("unknown:%s %s", req.Method, req.URL.Path)
	}
	return prefix + ":" + op
}
