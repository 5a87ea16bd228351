package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/settings"
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

// TestProvisionNamedQueues: --queues creates each named queue with its
// DLQ beside the job queue and prints NEXJOB_QUEUES naming them (url,
// arn, dlq), what lambdamain.Local and the kit read; a bad name is a
// usage error and creates nothing (before: "flag provided but not
// defined").
func TestProvisionNamedQueues(t *testing.T) {
	cfg := awstest.Config(t)
	name := fmt.Sprintf("nj-provq-%d", time.Now().UnixNano()%1e9)
	var out bytes.Buffer
	c := &cli{stdout: &out, stderr: io.Discard, getenv: endpointOnly}
	if err := c.run(context.Background(), []string{"provision", name, "--queues", "bulk,reports"}); err != nil {
		t.Fatalf("provision --queues: %v\n%s", err, out.String())
	}
	var raw string
	for line := range strings.Lines(out.String()) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "export "+settings.EnvQueues+"="); ok {
			raw = strings.Trim(v, "'")
		}
	}
	var qs map[string]settings.NamedQueue
	if err := json.Unmarshal([]byte(raw), &qs); err != nil {
		t.Fatalf("NEXJOB_QUEUES %q: %v\n%s", raw, err, out.String())
	}
	q := sqs.NewFromConfig(cfg)
	for _, n := range []string{"bulk", "reports"} {
		nq := qs[n]
		if nq.URL == "" || nq.ARN == "" || nq.DLQURL == "" {
			t.Fatalf("queue %s: %+v", n, nq)
		}
		for _, url := range []string{nq.URL, nq.DLQURL} {
			if _, err := q.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url)}); err != nil {
				t.Fatalf("queue %s not created: %v", url, err)
			}
		}
	}
	var usage usageError
	if err := c.run(context.Background(), []string{"provision", name + "-bad", "--queues", "no spaces"}); !errors.As(err, &usage) {
		t.Fatalf("a bad queue name: %v, want a usage error", err)
	}

	// --recurring: a schedule group, and the variables Recurring needs
	// (placeholders: lambdamain.Local fires the group's schedules).
	out.Reset()
	if err := c.run(context.Background(), []string{"provision", name, "--recurring"}); err != nil {
		t.Fatalf("provision --recurring: %v", err)
	}
	for _, v := range []string{settings.EnvScheduleGroup + "=" + name + "-recurring", settings.EnvScheduleTarget + "=", settings.EnvSchedulerRole + "="} {
		if !strings.Contains(strings.ReplaceAll(out.String(), "'", ""), "export "+v) {
			t.Fatalf("provision --recurring printed no %s:\n%s", v, out.String())
		}
	}
	if _, err := scheduler.NewFromConfig(cfg).GetScheduleGroup(context.Background(), &scheduler.GetScheduleGroupInput{Name: aws.String(name + "-recurring")}); err != nil {
		t.Fatalf("the schedule group: %v", err)
	}
	noEmulator := &cli{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	if err := noEmulator.run(context.Background(), []string{"provision", name, "--recurring", "--yes"}); !errors.As(err, &usage) {
		t.Fatalf("--recurring with no emulator: %v, want a usage error", err)
	}
}
