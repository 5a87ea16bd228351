// Package proof_test holds the layout's rule: the proof and measurement
// harness (internal/proof/...: the soak, the fault transport, the test
// environment, the benchmarks' comparisons, the capacity model) is
// imported by tests and by itself only, never by code that runs in a
// Lambda, a producer, the CLI or a team's tests through the kit.
package proof_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/nexjob/nexjob-aws"

// TestRuntimeNeverImportsTheHarness lists every non-test package of the
// module with its dependencies (go list, no test files) and fails for any
// outside internal/proof that depends on a package inside it.
func TestRuntimeNeverImportsTheHarness(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	checked := 0
	for line := range strings.Lines(string(out)) {
		pkg, deps, _ := strings.Cut(strings.TrimSpace(line), " ")
		if strings.HasPrefix(pkg, module+"/internal/proof") {
			continue
		}
		checked++
		for dep := range strings.FieldsSeq(deps) {
			if strings.HasPrefix(dep, module+"/internal/proof") {
				t.Errorf("%s imports the proof harness (%s): runtime code must not link it", pkg, dep)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("%d runtime packages checked: go list found too few", checked)
	}
}
