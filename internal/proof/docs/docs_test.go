// Package docs holds the check that the README and the guides under
// docs/ show code that compiles: every Go block is a whole file, named by
// its first line ("// jobs/jobs.go"), and the blocks of one page are one
// module (example.com/myapp, the quick start's) built and vetted against
// this checkout. The README's quick start is run too: its tests pass as
// a new app's would; and docs/idempotency.md's blocks run their happy
// path and their repeat (TestIdempotencyBlocksRun, with the tests in
// testdata/idempotency).
package docs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const root = "../../.." // the repository, from internal/proof/docs

// block is one Go code block of a page.
type block struct {
	page string // its page, from the repository's root
	line int    // where it starts in the page
	path string // the file it says it is
	code string
}

var fence = regexp.MustCompile("(?ms)^([ \t]*)```go\n(.*?)\n[ \t]*```[ \t]*$")

// blocks returns every Go block of page.
func blocks(t testing.TB, page string) []block {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	var out []block
	for _, m := range fence.FindAllSubmatchIndex(data, -1) {
		code := string(data[m[4]:m[5]])
		line := bytes.Count(data[:m[0]], []byte("\n")) + 1
		first, _, _ := strings.Cut(code, "\n")
		path, ok := strings.CutPrefix(first, "// ")
		if !ok || !strings.HasSuffix(path, ".go") || strings.Contains(path, " ") {
			t.Errorf("%s:%d: a Go block must be a whole file whose first line names it (// dir/file.go), not %q", page, line, first)
			continue
		}
		out = append(out, block{page: page, line: line, path: path, code: code})
	}
	return out
}

// pages are the README and every guide.
func pages(t *testing.T) []string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, g := range guides {
		out = append(out, filepath.Join("docs", filepath.Base(g)))
	}
	return out
}

// module writes page's blocks as a module beside this checkout (replaced
// into it, with its go.sum) and returns its directory.
func module(t testing.TB, bs []block) string {
	t.Helper()
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mod := "module example.com/myapp\n\ngo 1.26.0\n\nrequire github.com/nexjob/nexjob-aws v0.0.0-00010101000000-000000000000\n\nreplace github.com/nexjob/nexjob-aws => " + abs + "\n"
	sums := []string{filepath.Join(abs, "go.sum")}
	for _, b := range bs {
		if strings.HasPrefix(b.path, "deploy/") && !strings.Contains(mod, "/infra") {
			mod += "\nrequire github.com/nexjob/nexjob-aws/infra v0.0.0-00010101000000-000000000000\n\nreplace github.com/nexjob/nexjob-aws/infra => " + filepath.Join(abs, "infra") + "\n"
			sums = append(sums, filepath.Join(abs, "infra", "go.sum"))
		}
	}
	var sum []byte
	for _, s := range sums {
		data, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		sum = append(sum, data...)
	}
	write(t, filepath.Join(dir, "go.mod"), mod)
	write(t, filepath.Join(dir, "go.sum"), string(sum))
	for _, b := range bs {
		p := filepath.Join(dir, filepath.FromSlash(b.path))
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s:%d: %s is a second block of the same file", b.page, b.line, b.path)
		}
		write(t, p, b.code+"\n")
	}
	return dir
}

func write(t testing.TB, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// goCmd runs the go command in dir and returns its output.
func goCmd(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestEveryGoBlockCompiles: each page's Go blocks, as the files they name,
// build and pass go vet (test files included). A snippet that does not
// compile as pasted (the quick start's had no package lines or imports:
// 13 imports to guess) fails here, naming its page.
func TestEveryGoBlockCompiles(t *testing.T) {
	t.Parallel()
	n := 0
	for _, page := range pages(t) {
		bs := blocks(t, page)
		if len(bs) == 0 {
			continue
		}
		n += len(bs)
		t.Run(page, func(t *testing.T) {
			t.Parallel()
			dir := module(t, bs)
			if out, err := goCmd(t, dir, "vet", "./..."); err != nil {
				var files []string
				for _, b := range bs {
					files = append(files, b.path+" (line "+strconv.Itoa(b.line)+")")
				}
				t.Fatalf("%s: its Go blocks do not build: %v\n%s\nblocks: %s", page, err, out, strings.Join(files, ", "))
			}
		})
	}
	if n < 10 {
		t.Fatalf("%d Go blocks in README and docs/: the pages are gone", n)
	}
}

// TestQuickStartPasses: the README's quick start, its files pasted into a
// new module, passes its own tests against this checkout: a retry with
// the default backoff, a 1-hour delay and a 30-day schedule, on the
// kit's clock.
func TestQuickStartPasses(t *testing.T) {
	t.Parallel()
	if os.Getenv("NEXJOB_NO_EMULATOR") == "1" && os.Getenv("CI") == "" {
		t.Skip("make check: the quick start's tests need the emulator (make test runs them)")
	}
	var qs []block
	for _, b := range blocks(t, "README.md") {
		if !strings.HasPrefix(b.path, "tour/") {
			qs = append(qs, b)
		}
	}
	dir := module(t, qs)
	out, err := goCmd(t, dir, "test", "-count=1", "-v", "./...")
	if err != nil {
		t.Fatalf("the quick start's tests: %v\n%s", err, out)
	}
	for _, name := range []string{"TestWelcomeRetriedWhileMailIsDown", "TestWelcomeAnHourLater", "TestReportInThirtyDays"} {
		if !strings.Contains(out, "--- PASS: "+name) {
			t.Errorf("the quick start's %s did not pass:\n%s", name, out)
		}
	}
	t.Logf("the quick start's tests:\n%s", out)
}

// TestDeployGuideSynthesises (issue 41 item 3): the whole app of
// docs/deploying.md (its kinds, its one binary, its API function, its
// stack with a recurring job declared in it) builds, and its stack
// synthesises, with placeholder bootstraps where the guide's build line
// writes them: the stack holds the construct, the API function granted
// to enqueue and the recurring job's schedule.
func TestDeployGuideSynthesises(t *testing.T) {
	t.Parallel()
	dir := module(t, blocks(t, filepath.Join("docs", "deploying.md")))
	for _, f := range []string{"jobs", "api"} {
		write(t, filepath.Join(dir, "build", f, "bootstrap"), "placeholder "+f)
	}
	if out, err := goCmd(t, dir, "build", "./shop", "./cmd/...", "./deploy/..."); err != nil {
		t.Fatalf("the guide's files do not build: %v\n%s", err, out)
	}
	outdir := t.TempDir()
	cmd := exec.Command("go", "run", "./deploy/app")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "CDK_OUTDIR="+outdir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the guide's stack does not synthesise: %v\n%s", err, out)
	}
	tpl, err := os.ReadFile(filepath.Join(outdir, "MyApp.template.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"AWS::Scheduler::Schedule"`, `"digest-eu"`, `"AWS::DynamoDB::Table"`, `"Api`} {
		if !strings.Contains(string(tpl), want) {
			t.Errorf("the synthesised stack has no %s", want)
		}
	}
}
