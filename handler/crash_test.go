package handler_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// crashJob appends "start" and "end" lines to a file shared across worker
// processes, so the test can see every run, including cut-off ones.
type crashJob struct {
	N     int  `json:"n"`
	Sleep int  `json:"sleepMs"`
	Exit  bool `json:"exit,omitempty"` // a poison job: the process dies every time it runs
}

func (crashJob) Kind() string { return "crash-test" }

// TestMain doubles as the separate worker process of the crash tests: with
// NEXJOB_CRASH_WORKER=1 the test binary runs a local worker until killed.
func TestMain(m *testing.M) {
	if os.Getenv("NEXJOB_CRASH_WORKER") == "1" {
		crashWorker()
		return
	}
	os.Exit(m.Run())
}

func crashWorker() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		panic(err)
	}
	runs, err := os.OpenFile(os.Getenv("NEXJOB_RUNS_FILE"), os.O_APPEND|os.O_WRONLY|os.O_CREATE|os.O_SYNC, 0o600)
	if err != nil {
		panic(err)
	}
	reg := handler.NewRegistry()
	run := func(id string, attempt int, exit bool, sleep int) {
		fmt.Fprintf(runs, "start %s %d %d\n", id, attempt, time.Now().UnixNano())
		if exit {
			os.Exit(3) // not a panic: the process is gone, as with a runtime fatal error or an OOM kill
		}
		// Runs hold at the gate until the test opens it, so a kill before
		// that always cuts the runs that started.
		for !exists(os.Getenv("NEXJOB_RUNS_FILE") + ".open") {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(time.Duration(sleep) * time.Millisecond)
		fmt.Fprintf(runs, "end %s %d %d\n", id, attempt, time.Now().UnixNano())
	}
	handler.AddWorker(reg, handler.WorkFunc[crashJob](func(ctx context.Context, j *handler.Job[crashJob]) error {
		run(j.ID, j.Attempt, j.Args.Exit, j.Args.Sleep)
		return nil
	}), nil)
	handler.AddWorker(reg, handler.WorkFunc[tenantJob](func(ctx context.Context, j *handler.Job[tenantJob]) error {
		run(j.ID, j.Attempt, false, j.Args.Sleep)
		return nil
	}), &handler.KindOptions{Concurrency: tenantLimit})
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h, err := handler.New(cfg, os.Getenv("NEXJOB_TABLE"), os.Getenv("NEXJOB_QUEUE_URL"), reg, &handler.Options{Logger: log, StopBefore: 500 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	// Invocations of 5 s: a 250 ms run on a loaded machine (a fresh-clone
	// CI beside a 10k soak) outlived a 2 s one, and its message, back
	// after the lease, ran the job again with no kill.
	p := poller.New(sqs.NewFromConfig(cfg), os.Getenv("NEXJOB_QUEUE_URL"), h.Handle, &poller.Options{FunctionTimeout: 5 * time.Second, WaitTime: -1, Logger: log})
	_ = p.Run(ctx)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// startWorker starts the test binary as a worker process. Its runs hold
// after their start line until runsFile+".open" exists.
func startWorker(t *testing.T, e *awstest.Env, runsFile string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "NEXJOB_CRASH_WORKER=1", "NEXJOB_TABLE="+e.Table, "NEXJOB_QUEUE_URL="+e.QueueURL, "NEXJOB_RUNS_FILE="+runsFile)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

type run struct {
	attempt    int
	start, end int64
}

func readRuns(t *testing.T, path string) map[string][]run {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runs := map[string][]run{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 4 {
			continue // a line cut by SIGKILL
		}
		attempt, _ := strconv.Atoi(fs[2])
		at, _ := strconv.ParseInt(fs[3], 10, 64)
		rs := runs[fs[1]]
		switch fs[0] {
		case "start":
			rs = append(rs, run{attempt: attempt, start: at})
		case "end":
			if len(rs) > 0 && rs[len(rs)-1].attempt == attempt {
				rs[len(rs)-1].end = at
			}
		}
		runs[fs[1]] = rs
	}
	return runs
}

// TestCrashRecovery kills the worker process with SIGKILL in the middle of
// jobs (runs hold at a gate until the kills are done, so every kill cuts
// the runs in flight, whatever the machine's load), several times,
// restarts it, and checks that all 100 jobs end
// Succeeded, none is lost, and a job ran again only if a kill cut its
// earlier run.
func TestCrashRecovery(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, &awstest.QueueOptions{VisibilityTimeout: 3 * time.Second, MaxReceiveCount: 20})
	runsFile := t.TempDir() + "/runs"
	prod, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 100 {
		res, err := prod.Enqueue(context.Background(), crashJob{N: i, Sleep: 250}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	var kills []int64
	for range 4 {
		started := time.Now().UnixNano()
		w := startWorker(t, e, runsFile)
		// Kill only once this process has a run in flight: one started
		// after the process did. The gate is closed, so it cannot have
		// finished.
		for end := time.Now().Add(60 * time.Second); !startedSince(t, runsFile, started); {
			if time.Now().After(end) {
				t.Fatal("the worker started no run in a minute")
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = w.Process.Signal(syscall.SIGKILL)
		_ = w.Wait()
		// The kill's time is when the process is known dead, not when
		// the signal was sent: a run the process started between the two
		// was cut by this kill too (timed before the signal, such a run
		// read as rerun with no kill, twice in one make test at a load
		// of 2).
		kills = append(kills, time.Now().UnixNano())
	}
	if err := os.WriteFile(runsFile+".open", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, e, runsFile)
	defer func() { _ = w.Process.Kill(); _ = w.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		done := 0
		for _, id := range ids {
			rec, err := prod.Store().Get(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if rec.State == ledger.Succeeded {
				done++
			}
		}
		if done == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs Succeeded after the kills", done, len(ids))
		}
		time.Sleep(500 * time.Millisecond)
	}
	runs := readRuns(t, runsFile)
	twice, cut := 0, 0
	for _, id := range ids {
		rs := runs[id]
		if len(rs) == 0 {
			t.Errorf("job %s Succeeded without a recorded run", id)
			continue
		}
		if len(rs) > 1 {
			twice++
		}
		for i := 0; i+1 < len(rs); i++ {
			if !killedBetween(kills, rs[i].start, rs[i+1].start) {
				t.Errorf("job %s ran again (attempt %d) with no kill during its run %d", id, rs[i+1].attempt, rs[i].attempt)
			}
		}
		for _, r := range rs {
			if r.end == 0 {
				cut++
			}
		}
	}
	t.Logf("100 jobs, %d kills: all Succeeded, %d ran more than once, %d runs cut by a kill, 0 lost", len(kills), twice, cut)
	if cut < len(kills) {
		t.Fatalf("%d runs cut by %d kills: each kill should have cut a run in flight", cut, len(kills))
	}
}

// startedSince reports whether a run started after t (Unix ns).
func startedSince(t *testing.T, path string, since int64) bool {
	if _, err := os.Stat(path); err != nil {
		return false
	}
	for _, rs := range readRuns(t, path) {
		for _, r := range rs {
			if r.start > since {
				return true
			}
		}
	}
	return false
}

func killedBetween(kills []int64, from, to int64) bool {
	for _, k := range kills {
		if k > from && k < to {
			return true
		}
	}
	return false
}

var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// TestPoisonMessage: a job that kills its worker process every time
// reaches the DLQ through maxReceiveCount, more than once: the DLQ
// consumer sends it back while the ledger shows attempts left (receives
// are spent by more than runs), and fails it as an orphan once they are
// spent, so a poison job crashes at most MaxAttempts workers. Its
// dead-letter hook runs once, however often the last dead letter is
// delivered.
func TestPoisonMessage(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, &awstest.QueueOptions{VisibilityTimeout: 2 * time.Second, MaxReceiveCount: 2})
	runsFile := t.TempDir() + "/runs"
	prod, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	const attempts = 3
	res, err := prod.Enqueue(context.Background(), crashJob{Exit: true}, &enqueue.Opts{MaxAttempts: attempts})
	if err != nil {
		t.Fatal(err)
	}
	hooked := 0
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[crashJob](func(context.Context, *handler.Job[crashJob]) error { return nil }),
		&handler.KindOptions{OnDeadLetter: func(_ context.Context, rec ledger.Record, cause error) error {
			if rec.ID == res.ID && errors.Is(cause, handler.ErrOrphaned) {
				hooked++
			}
			return nil
		}})
	h, err := handler.New(e.Cfg, e.Table, e.QueueURL, reg, &handler.Options{Logger: quiet, MaxReturns: 2 * attempts})
	if err != nil {
		t.Fatal(err)
	}
	get := func() ledger.Record {
		rec, err := prod.Store().Get(context.Background(), res.ID)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	// Keep a worker alive: it dies on the poison job; start it again. Hand
	// what reaches the DLQ to the consumer (which leaves a job under a
	// live lease to its run: looked at again on the next round).
	var last events.SQSEvent
	deadLetters := 0
	for end := time.Now().Add(2 * time.Minute); get().State != ledger.Failed; {
		if time.Now().After(end) {
			t.Fatalf("the poison job never ended: %+v", get())
		}
		if dead := e.Messages(t, e.DLQURL); len(dead) > 0 {
			last = poller.Event(e.DLQURL, dead)
			deadLetters += len(dead)
			if _, err := h.HandleDeadLetters(context.Background(), last); err != nil {
				t.Fatal(err)
			}
			continue
		}
		w := startWorker(t, e, runsFile)
		exited := make(chan struct{})
		go func() { _ = w.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(3 * time.Second):
			_ = w.Process.Kill()
			<-exited
		}
	}
	rec := get()
	runs := len(readRuns(t, runsFile)[res.ID])
	if rec.State != ledger.Failed || !strings.Contains(rec.LastError, "orphaned") || runs > attempts {
		t.Fatalf("poison job: %s %q after %d runs; want Failed as an orphan after at most %d", rec.State, rec.LastError, runs, attempts)
	}
	if strings.Contains(rec.LastError, "dead-letter queue") { // the consumer ended it: its hook ran here, once
		for range 2 { // the last dead letter delivered again
			if resp, err := h.HandleDeadLetters(context.Background(), last); err != nil || len(resp.BatchItemFailures) != 0 {
				t.Fatalf("dead letters: %+v %v", resp, err)
			}
		}
		if hooked != 1 {
			t.Fatalf("hook called %d times, want once", hooked)
		}
	}
	t.Logf("poison job: %d runs, %d dead letters; ledger says %q", runs, deadLetters, rec.LastError)
}
