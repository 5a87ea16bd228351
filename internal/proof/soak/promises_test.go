package soak

import (
	"os"
	"regexp"
	"testing"
)

// TestEveryPromiseHasAChecker: every line of docs/reliability.md's "Promises the
// soak checks" names a checker the soak runs, and every checker is named
// by a promise: a promise with no checker, or a checker holding nothing
// written, fails here.
func TestEveryPromiseHasAChecker(t *testing.T) {
	readme, err := os.ReadFile("../../../docs/reliability.md") // the module's, from internal/proof/soak
	if err != nil {
		t.Fatal(err)
	}
	section := regexp.MustCompile(`(?s)### Promises the soak checks\n(.*?)(?:\n#|\z)`).FindSubmatch(readme)
	if section == nil {
		t.Fatal(`docs/reliability.md has no "### Promises the soak checks" section`)
	}
	line := regexp.MustCompile("(?m)^- (.+?) — checker `([a-z]+)`$")
	named := map[string]bool{}
	promises := line.FindAllSubmatch(section[1], -1)
	for _, m := range promises {
		name := string(m[2])
		if Checkers[name] == nil {
			t.Errorf("the promise %q names checker %q, which the soak does not run", m[1], name)
		}
		named[name] = true
	}
	if bullets := regexp.MustCompile(`(?m)^- `).FindAll(section[1], -1); len(bullets) != len(promises) {
		t.Errorf("%d promises listed, %d with a checker: every promise names its checker", len(bullets), len(promises))
	}
	for name := range Checkers {
		if !named[name] {
			t.Errorf("checker %q holds no promise the README lists", name)
		}
	}
	if len(promises) < 10 {
		t.Errorf("%d promises: the list is gone", len(promises))
	}
}
