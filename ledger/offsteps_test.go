package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// LoadSteps reads every step of a job back, over as many 1 MB pages as
// they take, names of any printable character included.
func TestLoadStepsReadsEveryPage(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	s, err := ledger.New(e.DB, e.Table, &ledger.Options{StepsTable: e.StepsTable})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ins, _, err := s.Insert(ctx, ledger.Record{Kind: "many", Args: "{}", State: ledger.Enqueued, MaxAttempts: 1}, "", ledger.RejectAlways, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Claim(ctx, ins.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	pad := strings.Repeat("v", 400) // 3,000 of about 500 bytes: two pages
	want := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("s.%d%c", i, rune(' '+i%95)) // every printable ASCII character
		want[name] = fmt.Sprintf(`"%d%s"`, i, pad)
		if _, err := s.PutStep(ctx, rec, ledger.OffSteps{}, name, want[name]); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.LoadSteps(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Values) != n {
		t.Fatalf("read back %d steps of %d", len(got.Values), n)
	}
	for k, v := range want {
		if got.Values[k] != v {
			t.Fatalf("step %q: read back %.20q, wrote %.20q", k, got.Values[k], v)
		}
	}
}
