package handler_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// The rig of the attack39 tests: one Env with a fault transport under the
// handler's client, a job kind whose work is the test's closure, and a
// child kind (a39Kid) whose work is the test's closure too.

type a39 struct {
	N int    `json:"n"`
	S string `json:"s,omitempty"`
}

func (a39) Kind() string { return "a39" }

type a39Kid struct {
	N    int    `json:"n"`
	Mode string `json:"mode,omitempty"`
	H    int    `json:"h,omitempty"` // hours, for the modes that sleep
}

func (a39Kid) Kind() string { return "a39-kid" }

type rig39 struct {
	e  *nexjobtest.Env
	h  *handler.Handler
	ft *faults.Transport

	mu    sync.Mutex
	calls map[string]int
}

type rig39Opts struct {
	work  func(ctx context.Context, j *handler.Job[a39]) error
	kopts *handler.KindOptions
	kid   func(ctx context.Context, j *handler.Job[a39Kid]) (string, error)
	env   *nexjobtest.Options
}

func newRig39(t *testing.T, o rig39Opts) *rig39 {
	t.Helper()
	r := &rig39{e: nexjobtest.New(t, o.env), calls: map[string]int{}}
	r.ft = faults.New(nil)
	r.e.Cfg = faults.Config(r.e.Cfg, r.ft)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[a39](o.work), o.kopts)
	if o.kid != nil {
		handler.AddWorkerResult(reg, handler.ResultFunc[a39Kid, string](o.kid), nil)
	}
	r.h = r.e.Handler(t, reg, &handler.Options{Logger: quiet})
	return r
}

// call counts a call under key and returns the count so far.
func (r *rig39) call(format string, a ...any) int {
	k := fmt.Sprintf(format, a...)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[k]++
	return r.calls[k]
}

func (r *rig39) n(format string, a ...any) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[fmt.Sprintf(format, a...)]
}

// deliver hands the job's message body to Handle as one SQS delivery of
// its own (a duplicate delivery, or a second worker's receive).
func (r *rig39) deliver(ctx context.Context, id, kind, msgID string) events.SQSEventResponse {
	body := fmt.Sprintf(`{"v":1,"id":%q,"kind":%q}`, id, kind)
	resp, _ := r.h.Handle(ctx, events.SQSEvent{Records: []events.SQSMessage{{MessageId: msgID, ReceiptHandle: "rh-" + msgID, Body: body}}})
	return resp
}
