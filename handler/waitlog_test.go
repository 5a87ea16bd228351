package handler_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// lockedBuffer is a log's text, written from the handler's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWaitLogNamesItsSignals (issue 41 item 7): the worker's log line of
// a run that ends in a wait names the signals it waits for (names, never
// a payload), beside its end.
func TestWaitLogNamesItsSignals(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	var buf lockedBuffer
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[reconcile](func(ctx context.Context, j *handler.Job[reconcile]) error {
		_, err := handler.WaitForAny(ctx, []string{"paid", "refused"}, time.Hour)
		return err
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	id := enqueueOne(t, e.Client, reconcile{}, nil)
	e.DrainNow(t, h)
	e.RequireState(t, id, ledger.Scheduled)
	var line string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, "job sleeping") {
			line = l
		}
	}
	if !strings.Contains(line, `signals="[paid refused]"`) || !strings.Contains(line, "until=") {
		t.Fatalf("the wait's log line does not name its signals: %q\nlog:\n%s", line, buf.String())
	}
}
