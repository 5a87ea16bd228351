package nexjobtest

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The kit runs only the Python it installed (or the one
// NEXJOB_MOTO_PYTHON names): a .cache/venv planted in a parent of the
// working directory (a shared temporary directory) is never run.
func TestMotoPythonIgnoresAPlantedVirtualenv(t *testing.T) {
	root := t.TempDir()
	marker := filepath.Join(root, "planted-python-ran")
	fake := func(path, body string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fake(filepath.Join(root, "shared", ".cache", "venv", "bin", "python"), "touch "+marker)
	cache := filepath.Join(root, "usercache")
	own := filepath.Join(cache, "nexjob", "moto-"+MotoVersion, "bin", "python")
	fake(own, "") // the kit's own install, already made
	work := filepath.Join(root, "shared", "project", "pkg")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work)
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("HOME", root)
	t.Setenv("NEXJOB_MOTO_PYTHON", "")
	py, err := motoPython()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err == nil || py != own {
		t.Fatalf("motoPython chose %s (the planted python ran: %v), want the kit's own %s", py, err == nil, own)
	}
}

// Every requirement the kit installs is pinned to one version and carries
// hashes (pip --require-hashes refuses the file otherwise), moto at
// MotoVersion among them.
func TestRequirementsArePinnedAndHashed(t *testing.T) {
	var name string
	hashes := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(requirements))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "--hash=sha256:"):
			if name == "" {
				t.Fatalf("a hash before any requirement: %q", line)
			}
			hashes[name]++
		case strings.HasPrefix(line, "--"):
			t.Fatalf("an option in the requirements: %q (the kit's install takes none)", line)
		default:
			req, _, _ := strings.Cut(line, " ")
			if !strings.Contains(req, "==") {
				t.Fatalf("requirement %q is not pinned to one version", req)
			}
			name = req
			hashes[name] = 0
		}
	}
	if len(hashes) < 10 {
		t.Fatalf("%d requirements: moto's dependencies are missing", len(hashes))
	}
	for req, n := range hashes {
		if n == 0 {
			t.Errorf("%s has no hash", req)
		}
	}
	if _, ok := hashes["moto=="+MotoVersion]; !ok {
		t.Errorf("moto==%s is not among the requirements", MotoVersion)
	}
}
