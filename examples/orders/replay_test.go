package orders_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"

	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/replay"
	"github.com/nexjob/nexjob-aws/vet/durable"
)

// openJobs is the committed export of open charges (`nexjob export
// orders.charge --redact` of a deployment, here made by the test kit):
// every build of the app must take them where they stand. Regenerate it
// with NEXJOB_WRITE_EXPORT=1 go test -run TestOpenJobsReplay, only when
// no job recorded by an older build can still be open.
const openJobs = "testdata/open-jobs.json"

// TestOpenJobsReplay is the deploy check in CI: the charges in flight in
// the committed export (waiting for their shipment, after their items
// were reserved, the card charged, the refund declared and the order
// marked paid) replay against the current code with no divergence.
func TestOpenJobsReplay(t *testing.T) {
	if os.Getenv("NEXJOB_WRITE_EXPORT") != "" {
		writeOpenJobs(t)
	}
	rep := nexjobtest.CheckReplay(t, orders.Registry(), openJobs)
	if rep.Jobs == 0 {
		t.Fatalf("%s holds no charge that ran: nothing was checked", openJobs)
	}
}

// writeOpenJobs makes two charges wait for shipments that keep failing,
// and exports them, redacted.
func writeOpenJobs(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s := newShop()
	s.holdShips = true
	for _, o := range []orders.Order{
		{ID: "3001", Cents: 2500, Card: "tok_visa", Email: "ada@example.com", Items: []orders.Item{{SKU: "mug", Qty: 1}, {SKU: "tea", Qty: 3}}},
		{ID: "3002", Cents: 900, Card: "tok_visa", Email: "bo@example.com", Items: []orders.Item{{SKU: "spoon", Qty: 2}}},
	} {
		if _, err := orders.Place(context.Background(), e.Client, o); err != nil {
			t.Fatal(err)
		}
	}
	e.DrainNow(t, shopHandler(t, e, s))
	ex := e.Export(t, orders.Charge{}.Kind(), &replay.Options{Redact: true})
	if len(ex.Jobs) != 2 {
		t.Fatalf("exported %d open charges, want 2", len(ex.Jobs))
	}
	if err := replay.Write(openJobs, ex); err != nil {
		t.Fatal(err)
	}
}

// A deliberate incompatible change (the charge step renamed with no
// alias) fails the replay check with a message naming the recorded step
// and the new one.
func TestRenamedChargeFailsTheReplayCheck(t *testing.T) {
	t.Parallel()
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[orders.Charge](func(ctx context.Context, j *handler.Job[orders.Charge]) error {
		if _, err := handler.Map(ctx, "reserve", j.Args.Items, func(context.Context, int, orders.Item) (string, error) {
			return "", nil
		}, nil); err != nil {
			return err
		}
		_, err := handler.Step(ctx, "charge-card", func(context.Context) (string, error) { return "", nil })
		return err
	}), nil)
	ex, err := replay.ReadFile(openJobs)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := replay.Check(context.Background(), reg, ex)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Divergences) != len(ex.Jobs) {
		t.Fatalf("%d divergences for %d jobs: %v", len(rep.Divergences), len(ex.Jobs), rep.Err())
	}
	for _, d := range rep.Divergences {
		if !strings.Contains(d.String(), `recorded step "charge"`) || !strings.Contains(d.String(), `reached "charge-card"`) {
			t.Errorf("the divergence does not name both steps: %s", d)
		}
	}
}

// A deliberate incompatible change to orders.go (the shipment's wait
// with its error dropped, the order marked paid under a name made of the
// clock) fails the analyzer that `make vet` runs, each report naming the
// step: the same file, changed in memory, type-checked in this module.
func TestChangedOrdersFailTheAnalyzer(t *testing.T) {
	t.Parallel()
	path, err := filepath.Abs("orders.go")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	changed := string(src)
	for old, new := range map[string]string{
		`_, err = handler.Invoke[Label](ctx, "ship"`: `handler.Invoke[Label](ctx, "ship"`,
		`handler.Step(ctx, "mark-paid", func`:        `handler.Step(ctx, "mark-paid-"+time.Now().Format("15"), func`,
	} {
		if !strings.Contains(changed, old) {
			t.Fatalf("orders.go no longer holds %q: update the test's change", old)
		}
		changed = strings.Replace(changed, old, new, 1)
	}
	for _, tc := range []struct {
		src  string
		want []string
	}{
		{string(src), nil},
		{changed, []string{`the error of handler.Invoke("ship") is dropped`, `handler.Step("mark-paid-" + time.Now().Format("15")): its name is built from time.Now`}},
	} {
		got := analyze(t, path, tc.src)
		if len(got) != len(tc.want) {
			t.Errorf("%d reports, want %d: %q", len(got), len(tc.want), got)
			continue
		}
		for _, w := range tc.want {
			found := false
			for _, g := range got {
				found = found || strings.Contains(g, w)
			}
			if !found {
				t.Errorf("no report says %q: %q", w, got)
			}
		}
	}
}

// analyze runs the durable analyzer on this package with path's source
// replaced by src, and returns its reports.
func analyze(t *testing.T, path, src string) []string {
	t.Helper()
	cfg := &packages.Config{Mode: packages.LoadAllSyntax, Overlay: map[string][]byte{path: []byte(src)}}
	pkgs, err := packages.Load(cfg, ".")
	if err != nil {
		t.Fatal(err)
	}
	if n := packages.PrintErrors(pkgs); n > 0 {
		t.Fatalf("%d errors loading the package", n)
	}
	g, err := checker.Analyze([]*analysis.Analyzer{durable.Analyzer}, pkgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, act := range g.Roots {
		if act.Err != nil {
			t.Fatal(act.Err)
		}
		for _, d := range act.Diagnostics {
			out = append(out, d.Message)
		}
	}
	return out
}
