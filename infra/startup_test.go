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
	"regexp"
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
	operator := awsiam.NewRole(stack, jsii.String("Operator"), &awsiam.RoleProps{AssumedBy: awsiam.NewAccountRootPrincipal()})
	q.GrantOperate(operator)
	signaller := awsiam.NewRole(stack, jsii.String("Signaller"), &awsiam.RoleProps{AssumedBy: awsiam.NewAccountRootPrincipal()})
	q.GrantSignal(signaller)
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
	e := nexjobtest.New(t, &nexjobtest.Options{BlobBucket: true})
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
			if vars[settings.EnvKeySecretWithheld] == "true" {
				if _, ok := vars[settings.EnvKeySecretParameter]; ok || granted.allows("ssm:GetParameter") || slices.Contains(rec.calls(role), "ssm:GetParameter") {
					t.Errorf("%s: the key secret is withheld, yet given (env %v, grant %v)", role, ok, granted.allows("ssm:GetParameter"))
				}
			} else if settings.NeedsKeySecret(settings.Role(role)) {
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
	case settings.EnvStepsTable:
		return e.StepsTable
	case settings.EnvBlobBucket:
		return e.BlobBucket
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
				continue // denies grant nothing
			}
			res, _ := json.Marshal(s["Resource"])
			for _, a := range toStrings(s["Action"]) {
				g[a] = append(g[a], string(res))
			}
		}
	}
	return g
}

// recorder is a reverse proxy to the emulator that records the IAM action
// of each request, per role (the path's first segment names the role):
// a TransactWriteItems as the action of each of its items, as IAM
// authorises it; and the attribute names and ReturnValues of each
// UpdateItem (a transaction's Updates too).
type recorder struct {
	srv     *httptest.Server
	mu      sync.Mutex
	got     map[string][]string
	updated map[string]map[string]bool // role → attribute names its UpdateItems named
	returns map[string]map[string]bool // role → its UpdateItems' ReturnValues ("" for none)
}

func newRecorder(t *testing.T, backend string) *recorder {
	u, err := url.Parse(backend)
	if err != nil || backend == "" {
		t.Fatalf("no emulator endpoint: %q", backend)
	}
	r := &recorder{got: map[string][]string{}, updated: map[string]map[string]bool{}, returns: map[string]map[string]bool{}}
	proxy := httputil.NewSingleHostReverseProxy(u)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		role, rest, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/"), "/")
		req.URL.Path = "/" + rest
		act := action(req)
		acts := []string{act}
		var ws []itemWrite
		if act == "dynamodb:UpdateItem" || act == "dynamodb:TransactWriteItems" {
			body, _ := io.ReadAll(req.Body)
			req.Body = io.NopCloser(bytes.NewReader(body))
			ws = itemWrites(act, body)
			if act == "dynamodb:TransactWriteItems" {
				acts = nil
				for _, w := range ws {
					acts = append(acts, w.action)
				}
			}
		}
		r.mu.Lock()
		r.got[role] = append(r.got[role], acts...)
		if r.updated[role] == nil {
			r.updated[role], r.returns[role] = map[string]bool{}, map[string]bool{}
		}
		for _, w := range ws {
			if w.action != "dynamodb:UpdateItem" {
				continue
			}
			r.returns[role][w.returnValues] = true
			for _, n := range w.names {
				r.updated[role][n] = true
			}
		}
		r.mu.Unlock()
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// itemWrite is one item's write in a request, as IAM authorises it: its
// action, the attribute names it names, its ReturnValues.
type itemWrite struct {
	action       string
	names        []string
	returnValues string
}

// expression is the part of an item write that names attributes.
type expression struct {
	Key                      map[string]any
	Item                     map[string]any
	ExpressionAttributeNames map[string]string
	UpdateExpression         string
	ConditionExpression      string
	ReturnValues             string
}

// itemWrites are the item writes of an UpdateItem or TransactWriteItems
// request body.
func itemWrites(act string, body []byte) []itemWrite {
	if act == "dynamodb:UpdateItem" {
		var in expression
		_ = json.Unmarshal(body, &in)
		return []itemWrite{{action: act, names: attributeNames(in), returnValues: in.ReturnValues}}
	}
	var in struct {
		TransactItems []struct{ Update, Put, Delete, ConditionCheck *expression }
	}
	_ = json.Unmarshal(body, &in)
	var out []itemWrite
	for _, it := range in.TransactItems {
		switch {
		case it.Update != nil:
			out = append(out, itemWrite{action: "dynamodb:UpdateItem", names: attributeNames(*it.Update)})
		case it.Put != nil:
			out = append(out, itemWrite{action: "dynamodb:PutItem", names: attributeNames(*it.Put)})
		case it.Delete != nil:
			out = append(out, itemWrite{action: "dynamodb:DeleteItem", names: attributeNames(*it.Delete)})
		case it.ConditionCheck != nil:
			out = append(out, itemWrite{action: "dynamodb:ConditionCheckItem", names: attributeNames(*it.ConditionCheck)})
		}
	}
	return out
}

// expressionWords are the words of DynamoDB's expressions that name no
// attribute.
var expressionWords = map[string]bool{
	"SET": true, "REMOVE": true, "ADD": true, "DELETE": true, "AND": true, "OR": true, "NOT": true, "IN": true, "BETWEEN": true,
	"attribute_exists": true, "attribute_not_exists": true, "attribute_type": true, "begins_with": true, "contains": true,
	"size": true, "if_not_exists": true, "list_append": true,
}

// attributeNames are the top-level attribute names an item write names,
// as IAM's dynamodb:Attributes sees them at most: its key (a put's item),
// and the first name of every document path of its update and condition
// expressions (the condition's too: IAM may count them), a placeholder
// read through ExpressionAttributeNames. A name after a "." is a map's
// key (a step's name), not an attribute.
func attributeNames(in expression) []string {
	var out []string
	for k := range in.Key {
		out = append(out, k)
	}
	for k := range in.Item {
		out = append(out, k)
	}
	for _, expr := range []string{in.UpdateExpression, in.ConditionExpression} {
		for _, m := range pathRE.FindAllStringSubmatchIndex(expr, -1) {
			word := expr[m[2]:m[3]]
			if before := strings.TrimRight(expr[:m[0]], " "); strings.HasSuffix(before, ".") || strings.HasPrefix(word, ":") {
				continue // a nested name, or a value
			}
			switch {
			case strings.HasPrefix(word, "#"):
				out = append(out, in.ExpressionAttributeNames[word])
			case !expressionWords[word] && (word[0] < '0' || word[0] > '9'):
				out = append(out, word) // a bare name
			}
		}
	}
	return out
}

// pathRE finds the words of an expression: names, placeholders, values.
var pathRE = regexp.MustCompile(`([#:]?[A-Za-z0-9_]+)`)

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
	if strings.Contains(req.Header.Get("User-Agent"), "api/s3#") {
		// S3's REST calls name no operation in a header: the method does.
		if op, ok := map[string]string{http.MethodGet: "GetObject", http.MethodPut: "PutObject", http.MethodHead: "HeadObject", http.MethodDelete: "DeleteObject"}[req.Method]; ok {
			return "s3:" + op
		}
	}
	svc, op, ok := strings.Cut(faults.Operation(req), ".")
	prefix := map[string]string{"DynamoDB": "dynamodb", "SSM": "ssm", "SQS": "sqs", "Scheduler": "scheduler"}[svc]
	if !ok || prefix == "" {
		return fmt.Sprintf("unknown:%s %s", req.Method, req.URL.Path)
	}
	return prefix + ":" + op
}
