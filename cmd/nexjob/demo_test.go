package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/internal/awstest"
)

// TestDemo runs what `make run` runs and checks both tables.
func TestDemo(t *testing.T) {
	cfg := awstest.Config(t)
	var out bytes.Buffer
	if _, err := demo(context.Background(), cfg, &out); err != nil {
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
}
