package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// pageTexts are the texts of pages(t), by page.
func pageTexts(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, page := range pages(t) {
		data, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		out[page] = string(data)
	}
	return out
}

var (
	cited       = regexp.MustCompile(`\b(?:(?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*|Example[A-Z][A-Za-z0-9_]*)(?:\*|…)?`)
	testFunc    = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)[A-Za-z0-9_]*)\(`)
	makeTarget  = regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`)
	usageLine   = regexp.MustCompile(`(?m)^  ([a-z][a-z-]+)(?: |$)`)
	spanCommand = regexp.MustCompile("`(make|nexjob) ([a-z][a-z-]*)")
	lineCommand = regexp.MustCompile(`(?m)^\s*(?:\$ )?(make|nexjob) ([a-z][a-z-]*)`)
)

// notCommands are spans that begin like a command and are not one.
var notCommands = map[string]bool{
	"nexjob job": true, // the EventBridge detail-type "nexjob job ended"
}

// TestDocsNameRealCommandsAndTests (issue 41 item 4: every command and
// figure is run or pinned by a test): each figure of the README and the
// guides names the test that pins it, so every test, benchmark, fuzz
// target or example a page names must exist in some _test.go of the
// repository (its modules included); every `make T` must be a Makefile
// target, and every `nexjob C` a command the CLI's usage lists. A test
// renamed or removed, a target or a command gone, fails here instead of
// leaving a figure pinned by nothing or a command that no longer runs.
func TestDocsNameRealCommandsAndTests(t *testing.T) {
	have := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && p != root || d.Name() == "node_modules" || d.Name() == "cdk.out") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(data), -1) {
			have[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(have) < 100 {
		t.Fatalf("found %d test functions in the repository; the walk is wrong", len(have))
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range makeTarget.FindAllStringSubmatch(string(mk), -1) {
		targets[m[1]] = true
	}
	cli, err := os.ReadFile(filepath.Join(root, "cmd", "nexjob", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	commands := map[string]bool{}
	for _, m := range usageLine.FindAllStringSubmatch(string(cli), -1) {
		commands[m[1]] = true
	}
	if !targets["test"] || !commands["get"] {
		t.Fatalf("Makefile targets %v, CLI commands %v: the parse is wrong", targets, commands)
	}
	texts := pageTexts(t)
	for _, text := range texts {
		for _, m := range testFunc.FindAllStringSubmatch(text, -1) {
			have[m[1]] = true // a test a page's own Go block writes (the quick start's)
		}
	}
	var bad []string
	for page, text := range texts {
		for _, name := range cited.FindAllString(text, -1) {
			if prefix := strings.TrimRight(name, "*…"); prefix != name { // "TestX*", "TestX…": tests named TestX and more
				if !hasLonger(have, prefix) {
					bad = append(bad, page+": names the tests "+name+", and no _test.go has one")
				}
				continue
			}
			if !have[name] {
				bad = append(bad, page+": names "+name+", which no _test.go has")
			}
		}
		for _, m := range append(spanCommand.FindAllStringSubmatch(text, -1), lineCommand.FindAllStringSubmatch(text, -1)...) {
			switch cmd := m[1] + " " + m[2]; {
			case notCommands[cmd]:
			case m[1] == "make" && !targets[m[2]]:
				bad = append(bad, page+": `"+cmd+"`, and the Makefile has no target "+m[2])
			case m[1] == "nexjob" && !commands[m[2]]:
				bad = append(bad, page+": `"+cmd+"`, and the CLI's usage lists no command "+m[2])
			}
		}
	}
	sort.Strings(bad)
	bad = slices.Compact(bad)
	for _, b := range bad {
		t.Error(b)
	}
}

// hasLonger reports whether a name in have begins with prefix and is
// longer.
func hasLonger(have map[string]bool, prefix string) bool {
	for h := range have {
		if len(h) > len(prefix) && strings.HasPrefix(h, prefix) {
			return true
		}
	}
	return false
}
