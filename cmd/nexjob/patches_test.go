package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
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
