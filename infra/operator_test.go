package infra_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/infra"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/settings"
)

type approval struct{ Month string }

func (approval) Kind() string { return "approval" }

// operatorRig is a table with jobs in every state an operator acts on,
// and operators (package admin: the nexjob CLI's every write; the
// dashboard over it) whose requests go through the recording proxy, one
// role name per path.
type operatorRig struct {
	t   *testing.T
	e   *nexjobtest.Env
	rec *recorder
	h   *handler.Handler
}

func newOperatorRig(t *testing.T) *operatorRig {
	e := nexjobtest.New(t, &nexjobtest.Options{Queues: []string{"bulk"}})
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[chore](func(context.Context, *handler.Job[chore]) error { return nil }), nil)
	handler.AddWorker(reg, handler.WorkFunc[approval](func(ctx context.Context, j *handler.Job[approval]) error {
		_, err := handler.WaitForSignal[struct{ By string }](ctx, "approval", time.Hour)
		return err
	}), nil)
	return &operatorRig{t: t, e: e, rec: newRecorder(t, os.Getenv("AWS_ENDPOINT_URL")), h: e.Handler(t, reg, &handler.Options{Logger: quietLog})}
}

// admin is an operator whose requests are recorded as role. Its
// deployment no longer names the queue "bulk" (move-queue's case).
func (r *operatorRig) admin(role string) *admin.Admin {
	r.t.Helper()
	cfg := r.e.Cfg.Copy()
	cfg.BaseEndpoint = aws.String(r.rec.url(role))
	a, err := admin.New(settings.Settings{AWS: cfg, Table: r.e.Table, QueueURL: r.e.QueueURL, DLQURL: r.e.DLQURL, Retention: handler.DefaultRetention})
	if err != nil {
		r.t.Fatal(err)
	}
	return a
}

// job enqueues a chore (a producer's write, not recorded).
func (r *operatorRig) job(n int, o *enqueue.Opts) string {
	r.t.Helper()
	res, err := r.e.Client.Enqueue(context.Background(), chore{N: n}, o)
	if err != nil {
		r.t.Fatal(err)
	}
	return res.ID
}

// end claims job id and ends it in st (a worker's writes, not recorded).
func (r *operatorRig) end(id string, st ledger.State) {
	r.t.Helper()
	ctx := context.Background()
	store := r.e.Client.Store()
	rec, err := store.Claim(ctx, id, time.Minute)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := store.Finish(ctx, rec, ledger.Finish{State: st, LastError: "boom", Result: map[bool]string{true: `{"paid":1}`}[st == ledger.Succeeded]}); err != nil {
		r.t.Fatal(err)
	}
}

// child is a continuation of parents (a producer's write).
func (r *operatorRig) child(n int, parents ...string) string {
	r.t.Helper()
	ctx := context.Background()
	var res enqueue.Result
	var err error
	if len(parents) == 1 {
		res, err = r.e.Client.ContinueWith(ctx, parents[0], chore{N: n}, nil)
	} else {
		res, err = r.e.Client.ContinueWhenAll(ctx, parents, chore{N: n}, nil)
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return res.ID
}

func (r *operatorRig) state(id string) ledger.State { return r.e.Get(r.t, id).State }

// run runs every operator write (each of the CLI's, through admin as the
// CLI calls it, and each of the dashboard's, over HTTP) and returns the
// roles they were recorded under, the signal's last.
func (r *operatorRig) run() (roles []string) {
	t, ctx := r.t, context.Background()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// Signal (first: the worker drains only these jobs): a job asleep in
	// its wait, signalled by the CLI and by the dashboard.
	res, err := r.e.Client.Enqueue(ctx, approval{Month: "2026-11"}, nil)
	must("enqueue approval", err)
	res2, err := r.e.Client.Enqueue(ctx, approval{Month: "2026-12"}, nil)
	must("enqueue approval", err)
	r.e.DrainNow(t, r.h)
	must("signal", r.admin("signal").Signal(ctx, res.ID, "approval", `{"By":"ada"}`))
	ds := newDashboardClient(t, r.admin("signal"))
	ds.act("/jobs/"+res2.ID+"/signal", url.Values{"name": {"approval"}, "payload": {`{"By":"grace"}`}})
	r.e.DrainNow(t, r.h)
	for _, id := range []string{res.ID, res2.ID} {
		if st := r.state(id); st != ledger.Succeeded {
			t.Fatalf("the signalled job %s is %s", id, st)
		}
	}
	// Requeue: a Failed job, a Succeeded keyed one, a continuation whose
	// parent Succeeded, one whose parent is active again (it waits
	// again: a transaction with the parent's link), a parent whose
	// continuation its failure ended unrun (it waits again).
	failed := r.job(1, nil)
	r.end(failed, ledger.Failed)
	keyed := r.job(2, &enqueue.Opts{IdempotencyKey: "invoice-2", DuplicatePolicy: ledger.AllowAfterFailed})
	r.end(keyed, ledger.Succeeded)
	p1 := r.job(3, nil)
	c1 := r.child(31, p1)
	r.end(p1, ledger.Succeeded)
	must("release", r.e.Client.ReleaseContinuations(ctx, r.e.Get(t, p1)))
	r.end(c1, ledger.Failed)
	p2 := r.job(4, nil)
	c2 := r.child(41, p2)
	r.end(p2, ledger.Failed)
	must("cancel continuations", r.e.Client.CancelContinuations(ctx, r.e.Get(t, p2), "", time.Hour))
	p3 := r.job(5, nil)
	c3 := r.child(51, p3)
	r.end(p3, ledger.Succeeded)
	must("release", r.e.Client.ReleaseContinuations(ctx, r.e.Get(t, p3)))
	r.end(c3, ledger.Failed)
	_, err = r.e.Client.Requeue(ctx, p3) // its parent active again (a producer's requeue)
	must("requeue parent", err)
	// A job whose wait timed out (a worker's writes): its requeue asks
	// the next run to wait afresh (Record.ReopenWaits).
	timedOut := r.job(9, nil)
	store := r.e.Client.Store()
	claimed, err := store.Claim(ctx, timedOut, time.Minute)
	must("claim", err)
	claimed.Steps, err = store.RecordStep(ctx, claimed, ledger.WaitStep("approval"), "1")
	must("the wait's end", err)
	_, err = store.RecordTimeout(ctx, claimed, "approval")
	must("the wait's timeout", err)
	_, err = store.Finish(ctx, claimed, ledger.Finish{State: ledger.Failed, LastError: "no approval"})
	must("fail", err)
	a := r.admin("requeue")
	for _, id := range []string{failed, keyed, c1, p2, c3, timedOut} {
		_, err := a.Requeue(ctx, id)
		must("requeue "+id, err)
	}
	if st := r.state(c2); st != ledger.AwaitingContinuation {
		t.Fatalf("the requeued parent's continuation is %s, want waiting again", st)
	}
	if st := r.state(c3); st != ledger.AwaitingContinuation {
		t.Fatalf("the requeued continuation of an active parent is %s, want waiting again", st)
	}
	roles = append(roles, "requeue")

	// Requeue many: the CLI's requeue --state Failed --kind chore.
	for n := 6; n < 8; n++ {
		r.end(r.job(n, nil), ledger.Failed)
	}
	_, err = r.admin("requeue-all").RequeueAll(ctx, ledger.Filter{State: ledger.Failed, Kind: "chore"}, nil)
	must("requeue all", err)
	roles = append(roles, "requeue-all")

	// Cancel: an Enqueued job with a waiting continuation, a Scheduled
	// one, a running one (asked to stop at its next step).
	enq := r.job(8, nil)
	r.child(81, enq)
	sched := r.job(9, &enqueue.Opts{Delay: time.Hour})
	running := r.job(10, nil)
	if _, err := r.e.Client.Store().Claim(ctx, running, time.Minute); err != nil {
		t.Fatal(err)
	}
	a = r.admin("cancel")
	_, err = a.Cancel(ctx, enq, "not needed")
	must("cancel", err)
	_, err = a.Cancel(ctx, sched, "")
	must("cancel scheduled", err)
	var asked *enqueue.CancelRequestedError
	if _, err := a.Cancel(ctx, running, "stop"); !errors.As(err, &asked) {
		t.Fatalf("cancel of a running job: %v, want it asked to stop", err)
	}
	roles = append(roles, "cancel")

	// Delete: an ended job, an active one, a Succeeded parent of a
	// waiting continuation (released) and of a fan-in one (counted), a
	// Failed parent of a waiting continuation (ended).
	ended := r.job(11, nil)
	r.end(ended, ledger.Failed)
	active := r.job(12, nil)
	ok1, ok2 := r.job(13, nil), r.job(14, nil)
	r.child(131, ok1)
	fanIn := r.child(132, ok1, ok2)
	r.end(ok1, ledger.Succeeded)
	bad := r.job(15, nil)
	r.child(151, bad)
	r.end(bad, ledger.Failed)
	a = r.admin("delete")
	for _, id := range []string{ended, active, ok1, bad} {
		must("delete "+id, a.Delete(ctx, id))
	}
	if rec := r.e.Get(t, fanIn); !slices.Contains(rec.Released, ok1) {
		t.Fatalf("the fan-in continuation's released parents: %v, want the deleted Succeeded one", rec.Released)
	}
	roles = append(roles, "delete")

	// Redrive: a Failed job's and an active job's messages in the DLQ.
	deadFailed, deadActive := r.job(16, nil), r.job(17, nil)
	r.end(deadFailed, ledger.Failed)
	for _, id := range []string{deadFailed, deadActive} {
		if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.DLQURL), MessageBody: aws.String(enqueue.Message{V: 1, ID: id, Kind: "chore"}.Encode())}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := r.admin("redrive").Redrive(ctx, nil)
	if err != nil || rep.Done() != 2 {
		t.Fatalf("redrive: %+v %v", rep, err)
	}
	roles = append(roles, "redrive")

	// Move-queue: the jobs of a queue the deployment took out.
	onBulk := r.job(18, &enqueue.Opts{Queue: "bulk"})
	rep, err = r.admin("move-queue").MoveQueue(ctx, "bulk", "", nil)
	if err != nil || rep.Done() != 1 || r.e.Get(t, onBulk).Queue != "" {
		t.Fatalf("move-queue: %+v %v", rep, err)
	}
	roles = append(roles, "move-queue")

	// The dashboard's writes, over HTTP: requeue, cancel, delete, redrive.
	dashFailed, dashEnq, dashDel, dashDead := r.job(19, nil), r.job(20, nil), r.job(21, nil), r.job(22, nil)
	r.end(dashFailed, ledger.Failed)
	r.end(dashDead, ledger.Failed)
	if _, err := r.e.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(r.e.DLQURL), MessageBody: aws.String(enqueue.Message{V: 1, ID: dashDead, Kind: "chore"}.Encode())}); err != nil {
		t.Fatal(err)
	}
	d := newDashboardClient(t, r.admin("dashboard"))
	d.act("/jobs/"+dashFailed+"/requeue", nil)
	d.act("/jobs/"+dashEnq+"/cancel", url.Values{"reason": {"no"}})
	d.act("/jobs/"+dashDel+"/delete", nil)
	d.act("/dlq/redrive", nil)
	if r.state(dashFailed) != ledger.Enqueued || r.state(dashEnq) != ledger.Failed || r.state(dashDead) != ledger.Enqueued {
		t.Fatalf("the dashboard's writes: %s %s %s", r.state(dashFailed), r.state(dashEnq), r.state(dashDead))
	}
	roles = append(roles, "dashboard")

	return append(roles, "signal")
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// dashboardClient drives a write dashboard over HTTP as a browser does.
type dashboardClient struct {
	t   *testing.T
	srv *httptest.Server
	c   *http.Client
}

func newDashboardClient(t *testing.T, a *admin.Admin) *dashboardClient {
	srv := httptest.NewServer(dashboard.New(a, &dashboard.Options{Write: true, Logger: quietLog}))
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return &dashboardClient{t: t, srv: srv, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// act opens the action's confirmation page and posts its form.
func (d *dashboardClient) act(path string, form url.Values) {
	d.t.Helper()
	resp, err := d.c.Get(d.srv.URL + path)
	if err != nil {
		d.t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	m := csrfRE.FindSubmatch(page)
	if resp.StatusCode != http.StatusOK || m == nil {
		d.t.Fatalf("GET %s: %d\n%s", path, resp.StatusCode, page)
	}
	if form == nil {
		form = url.Values{}
	}
	form.Set("csrf", string(m[1]))
	req, _ := http.NewRequest(http.MethodPost, d.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err = d.c.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		d.t.Fatalf("POST %s: %d\n%s", path, resp.StatusCode, body)
	}
}

// TestOperatorWritesOnlyItsAttributes runs every operator write against
// the emulator through the recording proxy: the CLI's requeue (a job, a
// keyed one, continuations whose parent Succeeded or is active again, a
// parent whose continuation waits again), requeue of many, cancel (an
// Enqueued job with a continuation, a Scheduled one, a running one),
// delete (ended, active, a Succeeded parent of a waiting and of a fan-in
// continuation, a Failed parent), redrive, move-queue and signal, and the
// write dashboard's requeue, cancel, delete, redrive and signal over HTTP.
// The attributes their UpdateItems name (the key, every update target
// and every name of a condition, as IAM may count them) are exactly
// infra.OperatorAttributes, the signal's exactly infra.SignalAttributes,
// the lists the construct's grants allow; none of them is one a worker or
// reader trusts (steps only for the signal); and every call is granted
// to the operator's, the signaller's and the write dashboard's roles.
func TestOperatorWritesOnlyItsAttributes(t *testing.T) {
	r := newOperatorRig(t)
	roles := r.run()
	named := func(roles ...string) []string {
		r.rec.mu.Lock()
		defer r.rec.mu.Unlock()
		set := map[string]bool{}
		for _, role := range roles {
			for a := range r.rec.updated[role] {
				set[a] = true
			}
		}
		return slices.Sorted(maps.Keys(set))
	}
	operator := roles[:len(roles)-1] // all but the signal
	if got, want := named(operator...), slices.Sorted(slices.Values(infra.OperatorAttributes)); !slices.Equal(got, want) {
		t.Errorf("the operator writes name %v;\ninfra.OperatorAttributes (GrantOperate's allow-list) is %v", got, want)
	}
	if got, want := named("signal"), slices.Sorted(slices.Values(infra.SignalAttributes)); !slices.Equal(got, want) {
		t.Errorf("the signals name %v;\ninfra.SignalAttributes (GrantSignal's allow-list) is %v", got, want)
	}
	for _, a := range trusted {
		if slices.Contains(infra.OperatorAttributes, a) || (a != ledger.AttrSteps && slices.Contains(infra.SignalAttributes, a)) {
			t.Errorf("%q, which a worker or reader trusts, is in an operator's allow-list", a)
		}
	}
	// Each call is granted to the role that makes it.
	resources := allOptions(t, "/nexjob/operator-test/key-secret")["Resources"].(map[string]any)
	role := func(prefix string) any {
		for id, res := range resources {
			if res.(map[string]any)["Type"] == "AWS::IAM::Role" && strings.HasPrefix(id, prefix) {
				return map[string]any{"Fn::GetAtt": []any{id, "Arn"}}
			}
		}
		t.Fatalf("no role %s", prefix)
		return nil
	}
	for who, calls := range map[string][]string{"Operator": r.calls(operator...), "Signaller": r.calls("signal"), "JobsWebDashboardRole": r.calls(roles...)} {
		granted := policyOf(resources, role(who))
		for _, c := range calls {
			if !granted.allows(c) {
				t.Errorf("%s calls %s, not granted", who, c)
			}
		}
	}
}

// calls are the actions the roles called.
func (r *operatorRig) calls(roles ...string) []string {
	var out []string
	for _, role := range roles {
		out = append(out, r.rec.calls(role)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// trusted are the attributes a worker or a reader takes as the job's own
// and no operator write names: what the job is (kind, args, its key and
// policy, its budget), what it did (steps, result, history), which run
// may write (token), and the bookkeeping of flow control and the hooks;
// and every attribute of an idempotent call's record.
var trusted = []string{
	ledger.AttrKind, ledger.AttrArgs, ledger.AttrArgsHash, ledger.AttrSteps, ledger.AttrResult, ledger.AttrToken,
	ledger.AttrHist0, ledger.AttrHist1, ledger.AttrHist2, ledger.AttrMaxAttempts, ledger.AttrPolicy,
	ledger.AttrRequest, ledger.AttrRequestAt, ledger.AttrCreatedAt, ledger.AttrHookPending, ledger.AttrHookUntil,
	ledger.AttrDefers, ledger.AttrSlot, ledger.AttrTicket, ledger.AttrByCheck,
	ledger.AttrCallState, ledger.AttrCallUntil, ledger.AttrCallPayload, ledger.AttrCallResult, ledger.AttrCallError, ledger.AttrCallPolicy, ledger.AttrCallPrev,
}

// updatable is what a role's policy lets its UpdateItem name: per Allow
// statement of dynamodb:UpdateItem, its dynamodb:Attributes allow-list
// (nil: any attribute), less what a Deny on dynamodb:Attributes names.
func updatable(t *testing.T, resources map[string]any, role any) (allows [][]string, denied []string) {
	t.Helper()
	roleID := role.(map[string]any)["Fn::GetAtt"].([]any)[0].(string)
	for _, res := range resources {
		r := res.(map[string]any)
		if r["Type"] != "AWS::IAM::Policy" {
			continue
		}
		props := r["Properties"].(map[string]any)
		if !slices.ContainsFunc(props["Roles"].([]any), func(ref any) bool { return ref.(map[string]any)["Ref"] == roleID }) {
			continue
		}
		for _, st := range props["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			s := st.(map[string]any)
			if !slices.Contains(toStrings(s["Action"]), "dynamodb:UpdateItem") {
				continue
			}
			cond, _ := s["Condition"].(map[string]any)
			if s["Effect"] == "Deny" {
				if c, ok := cond["ForAnyValue:StringEquals"].(map[string]any); ok {
					denied = append(denied, toStrings(c["dynamodb:Attributes"])...)
				}
				continue
			}
			var list []string
			if c, ok := cond["ForAllValues:StringEquals"].(map[string]any); ok {
				list = toStrings(c["dynamodb:Attributes"])
			}
			if list == nil {
				list = []string{"*"}
			}
			allows = append(allows, list)
		}
	}
	return allows, denied
}

// TestOperatorGrantProtectsWhatWorkersTrust synthesises an operator (a
// role granted GrantOperate: the nexjob CLI's), a signaller
// (GrantSignal) and the write dashboard, and reads what each one's
// UpdateItem may name: never an attribute a worker or reader trusts
// (trusted). The deny of kind and args alone let an UpdateItem naming
// steps make the worker pay a forged payee without running its lookup
// step, and one naming result change what Client.Result returns. Each
// UpdateItem grant is an allow-list (dynamodb:Attributes): the operator's
// is infra.OperatorAttributes, the signaller's infra.SignalAttributes
// (steps beside them: a signal is kept in the job's steps).
func TestOperatorGrantProtectsWhatWorkersTrust(t *testing.T) {
	doc := allOptions(t, "/nexjob/operator-test/key-secret")
	resources := doc["Resources"].(map[string]any)
	roles := map[string]any{}
	for id, res := range resources {
		r := res.(map[string]any)
		switch {
		case r["Type"] == "AWS::Lambda::Function" && r["Properties"].(map[string]any)["Environment"].(map[string]any)["Variables"].(map[string]any)[settings.EnvRole] == "dashboard":
			roles["the write dashboard"] = r["Properties"].(map[string]any)["Role"]
		case r["Type"] == "AWS::IAM::Role" && strings.HasPrefix(id, "Operator"):
			roles["an operator"] = map[string]any{"Fn::GetAtt": []any{id, "Arn"}}
		case r["Type"] == "AWS::IAM::Role" && strings.HasPrefix(id, "Signaller"):
			roles["a signaller"] = map[string]any{"Fn::GetAtt": []any{id, "Arn"}}
		}
	}
	for _, who := range []string{"an operator", "a signaller", "the write dashboard"} {
		role := roles[who]
		if role == nil {
			t.Errorf("no role of %s in the stack", who)
			continue
		}
		allows, denied := updatable(t, resources, role)
		if len(allows) == 0 {
			t.Errorf("%s may not UpdateItem at all", who)
		}
		for _, list := range allows {
			var open []string
			for _, a := range trusted {
				if (slices.Contains(list, "*") || slices.Contains(list, a)) && !slices.Contains(denied, a) {
					open = append(open, a)
				}
			}
			if who != "an operator" {
				open = slices.DeleteFunc(open, func(a string) bool { return a == ledger.AttrSteps }) // a signal is a step
			}
			if len(open) > 0 {
				t.Errorf("%s's UpdateItem may name %v (allowed %v, denied %v): attributes a worker or reader trusts", who, open, list, denied)
			}
		}
	}
}
