package handler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type condJob struct {
	HoldsAt int `json:"holdsAt"` // the look that finds it true (0: never)
}

func (condJob) Kind() string { return "cond-job" }

// WaitForCondition (issue 39 item 9): the condition is looked at once per
// look, the job sleeping between looks with no attempt spent; the value
// of the look that found it true is recorded and returned; a condition
// that never holds ends in a recorded *ConditionTimeoutError.
func TestWaitForCondition(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		holdsAt, looks int
		timedOut       bool
	}{{3, 3, false}, {0, 6, true}} {
		e := nexjobtest.New(t, nil)
		reg := handler.NewRegistry()
		looks := 0
		var got string
		var gotErr error
		handler.AddWorker(reg, handler.WorkFunc[condJob](func(ctx context.Context, j *handler.Job[condJob]) error {
			v, err := handler.WaitForCondition(ctx, "payout.settled", func(context.Context) (string, bool, error) {
				looks++
				if looks == j.Args.HoldsAt {
					return "settled-" + j.ID, true, nil
				}
				return "", false, nil
			}, &handler.ConditionOptions{Every: 10 * time.Minute, Timeout: 50 * time.Minute})
			if handler.IsSleep(err) {
				return err
			}
			got, gotErr = v, err
			return nil
		}), nil)
		h := e.Handler(t, reg, nil)
		res, err := e.Client.Enqueue(context.Background(), condJob{HoldsAt: tc.holdsAt}, nil)
		if err != nil {
			t.Fatal(err)
		}
		rec := e.RunToEnd(t, h, res.ID)
		var late *handler.ConditionTimeoutError
		switch {
		case rec.State != ledger.Succeeded || rec.Attempt != 1:
			t.Errorf("holds at %d: %s at attempt %d (%s)", tc.holdsAt, rec.State, rec.Attempt, rec.LastError)
		case looks != tc.looks:
			t.Errorf("holds at %d: looked %d times, want %d", tc.holdsAt, looks, tc.looks)
		case tc.timedOut && (!errors.As(gotErr, &late) || late.Looks != tc.looks):
			t.Errorf("never holds: %v, want a *ConditionTimeoutError after %d looks", gotErr, tc.looks)
		case !tc.timedOut && (gotErr != nil || got != "settled-"+res.ID):
			t.Errorf("holds at 3: %q, %v", got, gotErr)
		}
		if _, ok := rec.Steps["nexjob:cond:payout.settled"]; !ok {
			t.Errorf("holds at %d: the outcome is not recorded: %v", tc.holdsAt, rec.Steps)
		}
	}
}
