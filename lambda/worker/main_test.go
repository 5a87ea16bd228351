package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/examples/seedjobs"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

// rieVersion is AWS's Lambda Runtime Interface Emulator, pinned.
const rieVersion = "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@v0.0.0-20261030222936-bef5c4ba774d"

// TestUnderRuntimeInterfaceEmulator builds this main as a `bootstrap`, runs
// it under AWS's Lambda Runtime Interface Emulator (the real runtime API:
// lambda.Start, the invocation deadline, the JSON response), invokes it
// with an SQS event holding a real job message and a malformed one, and
// checks the partial-batch response and the ledger.
func TestUnderRuntimeInterfaceEmulator(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the runtime interface emulator runs on Linux only")
	}
	e := nexjobtest.New(t, nil)
	dir := t.TempDir()
	bootstrap := filepath.Join(dir, "bootstrap")
	build := exec.Command("go", "build", "-tags", "lambda.norpc", "-o", bootstrap, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build bootstrap: %v\n%s", err, out)
	}
	rie := installRIE(t)

	prod, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := prod.Enqueue(context.Background(), seedjobs.Payment{OrderID: "rie-1", AmountCents: 100}, &enqueue.Opts{IdempotencyKey: "payment-rie-1"})
	if err != nil {
		t.Fatal(err)
	}
	// The job's message, once a receive shows it (a loaded emulator can
	// answer the first receive empty: the event then held only the
	// malformed message, and the job stayed Enqueued).
	msgs := e.Messages(t, e.QueueURL)
	for end := time.Now().Add(30 * time.Second); len(msgs) == 0 && time.Now().Before(end); {
		msgs = e.Messages(t, e.QueueURL)
	}
	if len(msgs) != 1 {
		t.Fatalf("%d messages on the queue, want the job's one", len(msgs))
	}
	ev := poller.Event(e.QueueURL, msgs)
	ev.Records = append(ev.Records, events.SQSMessage{MessageId: "not-a-job", ReceiptHandle: "rh", Body: "{oops", EventSource: "aws:sqs"})

	addr := freeAddr(t)
	// Both of the emulator's ports on free addresses: its Runtime API
	// defaults to 127.0.0.1:9001, which a second test run on the machine
	// (another make test) would hold.
	cmd := exec.Command(rie, "--runtime-interface-emulator-address", addr, "--runtime-api-address", freeAddr(t), bootstrap)
	cmd.Env = append(os.Environ(), "NEXJOB_TABLE="+e.Table, "NEXJOB_QUEUE_URL="+e.QueueURL, "AWS_LAMBDA_FUNCTION_TIMEOUT=30")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	body, _ := json.Marshal(ev)
	var resp events.SQSEventResponse
	url := "http://" + addr + "/2015-03-31/functions/function/invocations"
	for start := time.Now(); ; {
		r, err := http.Post(url, "application/json", bytes.NewReader(body))
		if err == nil {
			err = json.NewDecoder(r.Body).Decode(&resp)
			_ = r.Body.Close()
			if err != nil {
				t.Fatalf("response: %v\n%s", err, logs.String())
			}
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("emulator did not answer: %v\n%s", err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != "not-a-job" {
		t.Fatalf("batchItemFailures = %+v, want only the malformed message\n%s", resp.BatchItemFailures, logs.String())
	}
	rec, err := prod.Store().Get(context.Background(), res.ID)
	if err != nil || rec.State != ledger.Succeeded || rec.Attempt != 1 {
		t.Fatalf("job after the invocation: %+v %v\n%s", rec, err, logs.String())
	}
}

// installRIE builds the pinned emulator into .cache/bin once.
func installRIE(t *testing.T) string {
	t.Helper()
	bin, err := filepath.Abs("../../.cache/bin")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(bin, "aws-lambda-rie")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	cmd := exec.Command("go", "install", rieVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install the runtime interface emulator: %v\n%s", err, out)
	}
	return path
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return fmt.Sprint(l.Addr())
}
