package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkFirstWeek times the newcomer's path (issue 41 item 8), each
// step once (make timings runs it with -benchtime 1x), reported as
// seconds: the README's figures are copied from its output.
//
//   - quickstart-cold: `go test ./...` of the README's quick start pasted
//     into a new module on a fresh machine: empty Go build and module
//     caches (every module downloaded from the proxy), no emulator
//     installed, pip's cache empty (the wheels downloaded).
//   - quickstart-warm: the same again (the emulator found running).
//   - make-run-cold, make-run-warm: `make run` in a fresh clone of this
//     checkout on another fresh machine (its Go and pip caches empty),
//     then again.
//   - make-check-cold, make-check-warm: `make check` in that clone on a
//     third fresh machine (golangci-lint built from source), then again.
//
// `make test` on a fresh clone is CI's own run (.ci/run), timed by it.
// Timings judge nothing here: a benchmark, never a pass/fail test.
func BenchmarkFirstWeek(b *testing.B) {
	if testing.Short() {
		b.Skip("downloads every module and wheel")
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		b.Fatal(err)
	}
	// A fresh machine for each cold step: its caches, in a folder of
	// their own (module files writable, so the folder can be removed);
	// the warm step after it runs on the same one.
	machines := map[string][]string{}
	envFor := func(step string) []string {
		m, _, _ := strings.Cut(step, "-warm")
		m, _, _ = strings.Cut(m, "-cold")
		if machines[m] == nil {
			machines[m] = freshEnv(b.TempDir())
		}
		return machines[m]
	}
	var qs []block
	for _, bl := range blocks(b, "README.md") {
		if !strings.HasPrefix(bl.path, "tour/") {
			qs = append(qs, bl)
		}
	}
	app := module(b, qs)
	clone := filepath.Join(b.TempDir(), "nexjob-aws")
	if out, err := exec.Command("git", "clone", "-q", root, clone).CombinedOutput(); err != nil {
		b.Fatalf("clone: %v\n%s", err, out)
	}
	steps := []struct {
		name string
		dir  string
		cmd  []string
	}{
		{"quickstart-cold", app, []string{"go", "test", "-mod=mod", "-count=1", "./..."}},
		{"quickstart-warm", app, []string{"go", "test", "-mod=mod", "-count=1", "./..."}},
		{"make-run-cold", clone, []string{"make", "run"}},
		{"make-run-warm", clone, []string{"make", "run"}},
		{"make-check-cold", clone, []string{"make", "check", "BASE=HEAD~1"}},
		{"make-check-warm", clone, []string{"make", "check", "BASE=HEAD~1"}},
	}
	for _, st := range steps {
		b.Run(st.name, func(b *testing.B) {
			for range b.N {
				cmd := exec.Command(st.cmd[0], st.cmd[1:]...)
				cmd.Dir, cmd.Env = st.dir, envFor(st.name)
				start := time.Now()
				out, err := cmd.CombinedOutput()
				took := time.Since(start)
				if err != nil {
					b.Fatalf("%s: %v\n%s", strings.Join(st.cmd, " "), err, out)
				}
				b.ReportMetric(took.Seconds(), "s/run")
			}
		})
	}
}

// freshEnv is this process's environment on a machine whose caches are
// under dir and empty: Go's build and module caches, the user cache
// directory (the kit's shared emulator and its virtualenv), pip's cache;
// no emulator given (AWS_ENDPOINT_URL unset: each path starts its own).
func freshEnv(dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "AWS_ENDPOINT_URL", "GOCACHE", "GOMODCACHE", "XDG_CACHE_HOME", "PIP_CACHE_DIR", "GOFLAGS", "NEXJOB_EMULATOR", "NEXJOB_MOTO_PYTHON":
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"GOCACHE="+filepath.Join(dir, "go-build"),
		"GOMODCACHE="+filepath.Join(dir, "go-mod"),
		"GOFLAGS=-modcacherw",
		"XDG_CACHE_HOME="+filepath.Join(dir, "cache"),
		"PIP_CACHE_DIR="+filepath.Join(dir, "pip"),
		"GOWORK=off",
	)
}
