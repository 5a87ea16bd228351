package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
)

// endpointOnly is an environment with only the emulator's endpoint: what
// `make run` gives the demo.
func endpointOnly(k string) string {
	if k == "AWS_ENDPOINT_URL" {
		return os.Getenv(k)
	}
	return ""
}

// TestDemo runs what `make run` runs and checks both tables and the last
// lines, which say how to open the dashboard.
func TestDemo(t *testing.T) {
	awstest.Config(t)
	var out bytes.Buffer
	c := &cli{stdout: &out, stderr: io.Discard, getenv: endpointOnly}
	if err := c.run(context.Background(), []string{"demo"}); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	text := out.String()
	want := []string{
		"Processing            existing id       existing id                   existing id",
		"Succeeded             new job           new job                       rejected (DuplicateJobError)",
		"Failed                new job           rejected (DuplicateJobError)  rejected (DuplicateJobError)",
		"record past its TTL   new job           new job                       new job",
		"payment        Succeeded  2/10",
		"welcome-email  Succeeded  1/10",
		"webhook        Failed     3/3       subscriber endpoint refused the connection (simulated)",
	}
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("demo output lacks %q:\n%s", w, text)
		}
	}
	if !strings.Contains(text, "To look at these jobs in the web dashboard: make dashboard\n") {
		t.Errorf("demo does not end with how to open the dashboard:\n%s", text)
	}
}

// TestDemoDashboard: `make dashboard` (demo --dashboard) serves the
// dashboard on the demo's own jobs until it is stopped.
func TestDemoDashboard(t *testing.T) {
	awstest.Config(t)
	ctx, stop := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	c := &cli{stdout: pw, stderr: io.Discard, getenv: endpointOnly}
	done := make(chan error, 1)
	go func() { done <- c.run(ctx, []string{"demo", "--dashboard", "127.0.0.1:0"}); _ = pw.Close() }()
	addr := regexp.MustCompile(`dashboard for table (\S+) on (http://\S+) \(read-only`)
	var m []string
	sc := bufio.NewScanner(pr)
	for m == nil && sc.Scan() {
		m = addr.FindStringSubmatch(sc.Text())
	}
	if m == nil {
		t.Fatalf("no dashboard line (%v)", <-done)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	resp, err := http.Get(m[2] + "jobs?state=Failed&kind=webhook")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "subscriber endpoint refused the connection") || !strings.Contains(string(body), m[1]) {
		t.Fatalf("%d\n%s", resp.StatusCode, body)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("demo --dashboard after Ctrl-C: %v", err)
	}
}

// TestEmulatorCommand: `nexjob emulator` gives a new app, with no
// repository and no Docker, an emulator: it prints export lines whose
// endpoint answers, and stops at Ctrl-C (the context's end).
func TestEmulatorCommand(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	c := &cli{stdout: pw, stderr: io.Discard, getenv: endpointOnly}
	done := make(chan error, 1)
	go func() { done <- c.run(ctx, []string{"emulator"}); _ = pw.Close() }()
	re := regexp.MustCompile(`^export AWS_ENDPOINT_URL='(http://127\.0\.0\.1:\d+)'$`)
	var endpoint string
	sc := bufio.NewScanner(pr)
	for endpoint == "" && sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			endpoint = m[1]
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if endpoint == "" {
		t.Fatalf("no export line for the endpoint (%v)", <-done)
	}
	resp, err := http.Get(endpoint + "/moto-api/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the emulator does not answer: %v", err)
	}
	_ = resp.Body.Close()
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
