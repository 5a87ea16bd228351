package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEmulatorInstall (issue 30, item 4): "nexjob emulator --install" is
// the README's warm-up before a new app's first go test: it installs the
// default emulator where the kit looks for it (or finds it there), says
// where, and exits; any other argument is a usage error.
func TestEmulatorInstall(t *testing.T) {
	py, err := filepath.Abs("../../.cache/venv/bin/python") // make test's own, installed by with-emulator.sh
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(py); err != nil && os.Getenv("NEXJOB_NO_EMULATOR") == "1" && os.Getenv("CI") == "" {
		t.Skip("make check: no emulator installed here (make test installs it)")
	} else if err != nil {
		t.Fatalf("no emulator at %s (make test installs it): %v", py, err)
	}
	t.Setenv("NEXJOB_MOTO_PYTHON", py)
	var out, errOut bytes.Buffer
	c := &cli{stdout: &out, stderr: &errOut, getenv: os.Getenv}
	if err := c.run(context.Background(), []string{"emulator", "--install"}); err != nil {
		t.Fatalf("emulator --install: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "is ready: "+py) {
		t.Fatalf("emulator --install said %q; want where it is", out.String())
	}
	var usage usageError
	if err := c.run(context.Background(), []string{"emulator", "--instal"}); !errors.As(err, &usage) {
		t.Fatalf("emulator --instal: %v; want a usage error", err)
	}
}
