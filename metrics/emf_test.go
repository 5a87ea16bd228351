package metrics_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/metrics"
)

// emfUnits are CloudWatch's metric units (the EMF specification's Unit).
var emfUnits = map[string]bool{
	"Seconds": true, "Microseconds": true, "Milliseconds": true, "Bytes": true, "Kilobytes": true, "Megabytes": true,
	"Gigabytes": true, "Terabytes": true, "Bits": true, "Kilobits": true, "Megabits": true, "Gigabits": true, "Terabits": true,
	"Percent": true, "Count": true, "Bytes/Second": true, "Kilobytes/Second": true, "Megabytes/Second": true,
	"Gigabytes/Second": true, "Terabytes/Second": true, "Bits/Second": true, "Kilobits/Second": true,
	"Megabits/Second": true, "Gigabits/Second": true, "Terabits/Second": true, "Count/Second": true, "None": true,
}

// checkEMF validates one line against the CloudWatch embedded metric
// format specification: the _aws metadata, each directive's namespace,
// dimension sets and metric definitions, and the root members they name
// (dimension values: strings of 1 to 1024 ASCII characters, not only
// whitespace, no control characters; metric values: numbers).
func checkEMF(line []byte) error {
	var root map[string]json.RawMessage
	if err := json.Unmarshal(line, &root); err != nil {
		return fmt.Errorf("not a JSON object: %w", err)
	}
	var aws struct {
		Timestamp         *int64 `json:"Timestamp"`
		CloudWatchMetrics []struct {
			Namespace  string     `json:"Namespace"`
			Dimensions [][]string `json:"Dimensions"`
			Metrics    []struct {
				Name string `json:"Name"`
				Unit string `json:"Unit"`
			} `json:"Metrics"`
		} `json:"CloudWatchMetrics"`
	}
	if err := json.Unmarshal(root["_aws"], &aws); err != nil || aws.Timestamp == nil || len(aws.CloudWatchMetrics) == 0 {
		return fmt.Errorf("_aws needs a Timestamp and CloudWatchMetrics: %s", root["_aws"])
	}
	if ts := time.UnixMilli(*aws.Timestamp); ts.Year() < 2000 {
		return fmt.Errorf("Timestamp %d is not epoch milliseconds", *aws.Timestamp)
	}
	for _, d := range aws.CloudWatchMetrics {
		if d.Namespace == "" || len(d.Namespace) > 255 || !printableASCII(d.Namespace) {
			return fmt.Errorf("namespace %q", d.Namespace)
		}
		for _, set := range d.Dimensions {
			if len(set) > 30 {
				return fmt.Errorf("a dimension set of %d", len(set))
			}
			for _, key := range set {
				var v string
				if err := json.Unmarshal(root[key], &v); err != nil {
					return fmt.Errorf("dimension %s is not a string member: %s", key, root[key])
				}
				if len(v) == 0 || len(v) > 1024 || strings.TrimSpace(v) == "" || !printableASCII(v) {
					return fmt.Errorf("dimension %s=%q: CloudWatch refuses it", key, v)
				}
			}
		}
		if len(d.Metrics) == 0 || len(d.Metrics) > 100 {
			return fmt.Errorf("%d metrics", len(d.Metrics))
		}
		for _, m := range d.Metrics {
			var v float64
			if m.Name == "" || len(m.Name) > 1024 || json.Unmarshal(root[m.Name], &v) != nil {
				return fmt.Errorf("metric %q has no numeric member", m.Name)
			}
			if m.Unit != "" && !emfUnits[m.Unit] {
				return fmt.Errorf("metric %s: unit %q", m.Name, m.Unit)
			}
		}
	}
	return nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// TestEMFLines: every line the recorder writes passes the EMF checks, for
// every metric, and a kind outside the rule (an old record's, a forged
// message's) becomes the one "invalid-kind" dimension value instead of
// one CloudWatch refuses (it wrote control and non-ASCII bytes as they
// were).
func TestEMFLines(t *testing.T) {
	var out bytes.Buffer
	r := metrics.New(&metrics.Options{Out: &out})
	for _, m := range []string{metrics.Enqueued, metrics.Deduplicated, metrics.Rejected, metrics.Succeeded, metrics.Failed, metrics.Retried, metrics.Expired, metrics.Orphaned, metrics.CutOff, metrics.Deferred} {
		r.Count(m, "orders.charge", "job-1")
	}
	r.Run(metrics.Succeeded, "orders/charge:v2", "job-2", 1500*time.Microsecond)
	for _, bad := range []string{"evil\x1b[31mred", "caf\u00e9", "line\nbreak", "\u202eright-to-left", strings.Repeat("k", 2000), ""} {
		r.Count(metrics.Enqueued, bad, "job-3")
	}
	lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
	if len(lines) != 17 {
		t.Fatalf("%d lines, want 17", len(lines))
	}
	for i, line := range lines {
		if err := checkEMF(line); err != nil {
			t.Errorf("line %d: %v\n%s", i, err, line)
		}
	}
	for _, line := range lines[11:] {
		if !bytes.Contains(line, []byte(`"Kind":"invalid-kind"`)) {
			t.Errorf("a bad kind was written as it was: %s", line)
		}
	}
}

// An idempotent call's line: the Function dimension (and none), the
// key's hash as a property, valid EMF.
func TestCallLines(t *testing.T) {
	var out bytes.Buffer
	r := metrics.New(&metrics.Options{Out: &out})
	for _, m := range []string{metrics.CallRun, metrics.CallReplayed, metrics.CallInProgress, metrics.CallMismatch} {
		r.Call(m, "charge-api", "3vq0n5yqzv6bq6x3")
	}
	r.Call(metrics.CallRun, "bad function\n", "h")
	r.Call(metrics.CallWithoutKey, "charge-api", "") // no key: no KeyHash
	lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
	if len(lines) != 6 {
		t.Fatalf("%d lines, want 6", len(lines))
	}
	for i, line := range lines {
		if err := checkEMF(line); err != nil {
			t.Errorf("line %d: %v\n%s", i, err, line)
		}
		if !bytes.Contains(line, []byte(`"Dimensions":[["Function"],[]]`)) || bytes.Contains(line, []byte(`"Kind"`)) {
			t.Errorf("line %d is not by Function: %s", i, line)
		}
	}
	if !bytes.Contains(lines[0], []byte(`"Function":"charge-api","KeyHash":"3vq0n5yqzv6bq6x3","CallRun":1`)) {
		t.Errorf("line 0: %s", lines[0])
	}
	if !bytes.Contains(lines[4], []byte(`"Function":"invalid-kind"`)) {
		t.Errorf("a bad function name was written as it was: %s", lines[4])
	}
	if !bytes.Contains(lines[5], []byte(`{"Function":"charge-api","CallWithoutKey":1,`)) {
		t.Errorf("an event without a key: %s", lines[5])
	}
}

// FuzzJobIDQuoted: a line carries the job id exactly as encoding/json
// quotes it, whatever its bytes (the recorder writes a plain one as it
// is, without encoding/json).
func FuzzJobIDQuoted(f *testing.F) {
	for _, s := range []string{"aaaaaaaaaaaaaaaaaaaaaaaaaa", "a\"b", `back\slash`, "<script>&", "tab\there", "caf\u00e9", "bad\xffutf8", "\u2028", "~ !#$%'()*+,-./:;=?@[]^_`{|}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if id == "" {
			return // no JobId is written
		}
		var out bytes.Buffer
		metrics.New(&metrics.Options{Out: &out}).Count(metrics.Enqueued, "k", id)
		want, err := json.Marshal(id)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(out.Bytes(), append(append([]byte(`"JobId":`), want...), ',')) {
			t.Fatalf("job id %q written as\n%s\nwant %s", id, out.Bytes(), want)
		}
		if err := checkEMF(bytes.TrimSpace(out.Bytes())); err != nil {
			t.Fatal(err)
		}
	})
}
