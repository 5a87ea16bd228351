package lambdamain

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/settings"
)

// TestLogsAreReadable (issue 30, item 10): a Lambda function's default
// log is JSON for CloudWatch, Local's is text for people, and in both a
// duration is written as one, not as integer nanoseconds; Local writes
// no EMF lines unless asked. Before: `"retry_in":10000000000`, and
// Local's lines were JSON with EMF lines between them.
func TestLogsAreReadable(t *testing.T) {
	var buf bytes.Buffer
	stdout = &buf
	t.Cleanup(func() { stdout = os.Stdout })
	logger(nil, settings.Worker).Info("nexjob: job failed, will retry", "retry_in", 10*time.Second)
	if got := buf.String(); !strings.Contains(got, `"retry_in":"10s"`) || !strings.Contains(got, `"function":"worker"`) {
		t.Fatalf("the function's line: %s; want JSON with retry_in \"10s\"", got)
	}
	buf.Reset()
	localLogger(nil).Info("nexjob: job succeeded", "took", 1500*time.Microsecond)
	if got := buf.String(); strings.HasPrefix(got, "{") || !strings.Contains(got, "took=1.5ms") || !strings.Contains(got, `msg="nexjob: job succeeded"`) {
		t.Fatalf("Local's line: %s; want text with took=1.5ms", got)
	}
	var s settings.Settings
	if o := handlerOptions(s, settings.Worker, nil, localLogger(nil), false); o.Metrics != nil {
		t.Fatalf("Local's handler writes EMF lines by default")
	}
	if o := handlerOptions(s, settings.Worker, nil, logger(nil, settings.Worker), true); o.Metrics == nil {
		t.Fatalf("a function's handler writes no EMF lines")
	}
}
