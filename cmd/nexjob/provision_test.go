package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
)

func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nexjob")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// TestProvisionExports: eval "$(nexjob provision NAME)" points a shell at
// the new table and queues on the same backend: a second command in that
// shell lists the (empty) table.
func TestProvisionExports(t *testing.T) {
	awstest.Config(t) // a backend, or skip (fail under CI)
	bin := buildCLI(t)
	name := fmt.Sprintf("nj-provision-%d", time.Now().UnixNano()%1e9)
	script := `eval "$(` + bin + ` provision ` + name + `)" && env -u AWS_REGION -u AWS_ACCESS_KEY_ID bash -c 'echo "$NEXJOB_TABLE $NEXJOB_QUEUE_URL"' && ` +
		// a fresh environment with only the exported lines
		`env -i PATH="$PATH" HOME="$HOME" AWS_ENDPOINT_URL="$AWS_ENDPOINT_URL" AWS_REGION="$AWS_REGION" AWS_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY" NEXJOB_TABLE="$NEXJOB_TABLE" NEXJOB_QUEUE_URL="$NEXJOB_QUEUE_URL" ` + bin + ` list Failed`
	cmd := exec.Command("bash", "-c", script)
	var stderr strings.Builder
	cmd.Stderr = &stderr // the SDK may log warnings there
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, stderr.String())
	}
	if !strings.HasPrefix(string(out), name+" http") {
		t.Fatalf("exports did not set the table and queue:\n%s", out)
	}
}

// TestNoRegion: with no AWS region the CLI says so at start.
func TestNoRegion(t *testing.T) {
	bin := buildCLI(t)
	cmd := exec.Command(bin, "list", "-table", "t", "Failed")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "AWS_EC2_METADATA_DISABLED=true"}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no AWS region: set AWS_REGION") {
		t.Fatalf("%v\n%s", err, out)
	}
}
