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

// A callback token is valid only if a run of its job issued it (issue 38
// item 14): a token made with the key secret and a job's id alone (and
// any nonce) completed the job's wait, since nothing was stored when a
// token was issued. Now the run records the token's nonce on the job, and
// Complete refuses a token whose nonce the job does not hold.
func TestCallbackTokenMintedFromTheSecretIsRefused(t *testing.T) {
	t.Parallel()
	secret := []byte("a deployment's secret")
	e := nexjobtest.New(t, &nexjobtest.Options{Ledger: ledger.Options{KeySecret: secret}})
	tokens := make(chan string, 4)
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[reconcile](func(ctx context.Context, j *handler.Job[reconcile]) error {
		tok, err := handler.CallbackToken(ctx, "bank")
		if err != nil {
			return err
		}
		again, err := handler.CallbackToken(ctx, "bank")
		if err != nil || again != tok {
			return handler.Permanent(errors.New("a second call in the run gave another token"))
		}
		tokens <- tok
		_, err = handler.WaitForSignal[approval](ctx, "bank", time.Hour)
		return err
	}), nil)
	h := e.Handler(t, reg, &handler.Options{Logger: quiet})
	ctx := context.Background()
	res, err := e.Client.Enqueue(ctx, reconcile{Ledger: "a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	var issued string
	select {
	case issued = <-tokens:
	default:
		t.Fatalf("the run issued no token: %s (%s)", e.Get(t, res.ID).State, e.Get(t, res.ID).LastError)
	}
	// Someone holding the secret (a read-only role, an idempotent
	// function) mints tokens for the job: any nonce, the right MAC.
	minter, err := ledger.New(e.DB, e.Table, &ledger.Options{KeySecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	for _, nonce := range []string{"n", "AAAAAAAAAAAAAAAAAAAAAA"} {
		forged, err := minter.CallbackToken(res.ID, "bank", nonce)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Client.Complete(ctx, forged, approval{By: "mallory"}); !errors.Is(err, ledger.ErrBadCallbackToken) {
			t.Fatalf("a token minted from the secret and the job's id: %v, want ErrBadCallbackToken", err)
		}
	}
	if rec := e.Get(t, res.ID); rec.Steps[ledger.SignalStep("bank")] != "" {
		t.Fatalf("the forged completion wrote the signal: %q", rec.Steps[ledger.SignalStep("bank")])
	}
	if err := e.Client.Complete(ctx, issued, approval{By: "bank"}); err != nil {
		t.Fatalf("the token the run issued: %v", err)
	}
	e.Drain(t, h)
	if rec := e.Get(t, res.ID); rec.State != ledger.Succeeded {
		t.Fatalf("the job after its token's completion: %s (%s)", rec.State, rec.LastError)
	}
}
