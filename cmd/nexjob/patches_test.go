package main

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/replay"
)

type pJob struct{}

func (pJob) Kind() string { return "p-job" }

// TestPatchesTellsWhenAPatchCanGo (issue 40 item 1): `nexjob patches`
// counts the open jobs by whether their code knew the patch, lists the
// old ones, and fails while any is left; 0 once they ended.
func TestPatchesTellsWhenAPatchCanGo(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	mk := func(patches []string) *handler.Handler {
		reg := handler.NewRegistry()
		handler.AddWorker(reg, handler.WorkFunc[pJob](func(ctx context.Context, j *handler.Job[pJob]) error {
			if _, err := handler.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
				return err
			}
			return handler.Sleep(ctx, "wait", time.Hour)
		}), &handler.KindOptions{Patches: patches})
		return e.Handler(t, reg, &handler.Options{Logger: quiet})
	}
	ctx := context.Background()
	old, err := e.Client.Enqueue(ctx, pJob{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.DrainNow(t, mk(nil)) // asleep under the code before the patch
	e.RequireState(t, old.ID, ledger.Scheduled)
	newer, err := e.Client.Enqueue(ctx, pJob{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	deployed := mk([]string{"v2"})
	e.DrainNow(t, deployed)
	e.RequireState(t, newer.ID, ledger.Scheduled)
	run := func(args ...string) (string, error) {
		out, _, err := runCLI(e, args...)
		return out, err
	}
	out, err := run("patches", "p-job", "v2")
	if !errors.Is(err, errPatchInUse) || !strings.Contains(out, "1 open p-job jobs take the old branch of \"v2\", 1 the new, 0 have not run") || !strings.Contains(out, "old: "+old.ID) {
		t.Fatalf("patches with an old job asleep: %v\n%s", err, out)
	}
	if _, err := e.Client.Cancel(ctx, old.ID, "", 0); err != nil {
		t.Fatal(err)
	}
	if out, err := run("patches", "p-job", "v2"); err != nil || !strings.Contains(out, "0 open p-job jobs take the old branch") {
		t.Fatalf("patches once the old job ended: %v\n%s", err, out)
	}
}

// TestExportPrintsTheOpenJobs (issue 40 item 3): `nexjob export KIND`
// prints the open jobs of the kind with their steps as the replay check
// reads them, writes nothing (the record unchanged), and with --redact
// holds no value of theirs.
func TestExportPrintsTheOpenJobs(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[pJob](func(ctx context.Context, j *handler.Job[pJob]) error {
		if _, err := handler.Step(ctx, "a", func(context.Context) (string, error) { return "secret-value", nil }); err != nil {
			return err
		}
		return handler.Sleep(ctx, "wait", time.Hour)
	}), nil)
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, pJob{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.DrainNow(t, e.Handler(t, reg, &handler.Options{Logger: quiet}))
	before := e.Get(t, res.ID)
	// Asleep after a run that gave its attempt back (issue 41 item 4: get
	// said "attempt 0 of 25" where the log said attempt=1).
	if got, _, err := runCLI(e, "get", res.ID); err != nil || !regexp.MustCompile(`attempts\s+0 of \d+ spent`).MatchString(got) {
		t.Fatalf("get of a sleeping job: %v\n%s", err, got)
	}
	out, _, err := runCLI(e, "export", "p-job")
	if err != nil {
		t.Fatal(err)
	}
	ex := decodeExport(t, out)
	if len(ex.Jobs) != 1 || ex.Jobs[0].ID != res.ID || ex.Jobs[0].Steps["a"] != `"secret-value"` || ex.Kind != "p-job" {
		t.Fatalf("export: %s", out)
	}
	if rep, err := replay.Check(ctx, reg, ex); err != nil || rep.Jobs != 1 || len(rep.Divergences) != 0 {
		t.Fatalf("the export does not replay against its own code: %v %v", err, rep.Err())
	}
	if after := e.Get(t, res.ID); after.UpdatedAt != before.UpdatedAt || after.Token != before.Token {
		t.Fatalf("export changed the job: %+v -> %+v", before, after)
	}
	out, _, err = runCLI(e, "export", "p-job", "--redact")
	if err != nil || strings.Contains(out, "secret-value") || !decodeExport(t, out).Redacted {
		t.Fatalf("export --redact: %v\n%s", err, out)
	}
}

func decodeExport(t *testing.T, out string) replay.Export {
	t.Helper()
	var ex replay.Export
	if err := json.Unmarshal([]byte(out), &ex); err != nil {
		t.Fatalf("export is not JSON: %v\n%s", err, out)
	}
	return ex
}
