package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestIdempotencyBlocksRun: every Go block of docs/idempotency.md, taken
// from the page as it is (so the code run is the doc's, byte for byte),
// runs its happy path and its repeat: testdata/idempotency holds test
// files written beside the blocks, as the files the blocks name would be
// tested in a new app. ChargeOnce's handler and Refund run twice against
// the emulator (the repeat replayed, not run); Wire runs twice on a
// synthesised stack. A block that compiles but fails when run (the
// response hook's header written into a nil map panicked on every
// repeat) fails here, naming its page.
func TestIdempotencyBlocksRun(t *testing.T) {
	t.Parallel()
	if os.Getenv("NEXJOB_NO_EMULATOR") == "1" && os.Getenv("CI") == "" {
		t.Skip("make check: the blocks' tests need the emulator (make test runs them)")
	}
	const page = "docs/idempotency.md"
	bs := blocks(t, page)
	dir := module(t, bs)
	tests := filepath.Join("testdata", "idempotency")
	covered := map[string]bool{}
	err := filepath.WalkDir(tests, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(tests, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		write(t, filepath.Join(dir, rel), string(data))
		covered[filepath.ToSlash(filepath.Dir(rel))] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if !covered[filepath.ToSlash(filepath.Dir(b.path))] {
			t.Errorf("%s:%d: %s has no test in %s: every block of the page must run", page, b.line, b.path, tests)
		}
	}
	out, err := goCmd(t, dir, "test", "-count=1", "-v", "./...")
	if err != nil {
		t.Fatalf("%s: its blocks' tests: %v\n%s", page, err, out)
	}
	for _, name := range []string{"TestChargeOnceRunsOnceThenReplays", "TestRefundRunsOnceThenReplays", "TestWireGivesTheSettingsAndTheGrant", "TestInMemoryRunsOnceThenReplays", "TestOnRedisRunsOnceThenReplays", "TestSharedWithPowertoolsRunsOnceThenReplays", "TestOnTheNexjobTableRunsOnceThenReplays"} {
		if !strings.Contains(out, "--- PASS: "+name) {
			t.Errorf("%s: %s did not pass:\n%s", page, name, out)
		}
	}
}
