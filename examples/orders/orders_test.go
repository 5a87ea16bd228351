package orders_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

func TestOrderChargedThenReceipt(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	placed, err := orders.Place(ctx, e.Client, orders.Order{ID: "1001", Cents: 4200, Card: "tok_visa", Email: "ada@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	e.RequireEnqueued(t, "orders.charge", "charge-1001")
	if rec := e.RequireEnqueued(t, "orders.receipt", "receipt-1001"); rec.State != ledger.AwaitingContinuation {
		t.Fatalf("receipt is %s before the charge ran", rec.State)
	}
	again, err := orders.Place(ctx, e.Client, orders.Order{ID: "1001", Cents: 4200, Card: "tok_visa", Email: "ada@example.com"})
	if err != nil || !again.Duplicate || again.ChargeID != placed.ChargeID || again.ReceiptID != placed.ReceiptID {
		t.Fatalf("placing again: %+v %v; want the same jobs", again, err)
	}
	e.Drain(t, e.Handler(t, orders.Registry(), nil))
	charge := e.RequireState(t, placed.ChargeID, ledger.Succeeded)
	receipt := e.RequireState(t, placed.ReceiptID, ledger.Succeeded)
	if receipt.UpdatedAt < charge.UpdatedAt || receipt.Attempt != 1 || charge.Attempt != 1 {
		t.Fatalf("charge %+v, receipt %+v", charge, receipt)
	}
}

func TestDeclinedCardThenPlacedAgain(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	h := e.Handler(t, orders.Registry(), nil)
	first, err := orders.Place(ctx, e.Client, orders.Order{ID: "1003", Cents: 999, Card: "declined_insufficient_funds", Email: "bo@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	if rec := e.RequireState(t, first.ChargeID, ledger.Failed); !strings.Contains(rec.LastError, orders.ErrDeclined.Error()) {
		t.Fatalf("charge: %q", rec.LastError)
	}
	if rec := e.RequireState(t, first.ReceiptID, ledger.Failed); !strings.Contains(rec.LastError, first.ChargeID) {
		t.Fatalf("receipt of a declined order: %q", rec.LastError)
	}
	// A receipt cannot wait on the failed charge.
	var pe *enqueue.ParentEndedError
	if _, err := e.Client.ContinueWith(ctx, first.ChargeID, orders.Receipt{OrderID: "1003"}, nil); !errors.As(err, &pe) {
		t.Fatalf("continuing a failed charge: %v", err)
	}
	// Placed again with a good card: charged, and the receipt sent.
	second, err := orders.Place(ctx, e.Client, orders.Order{ID: "1003", Cents: 999, Card: "tok_visa", Email: "bo@example.com"})
	if err != nil || second.Duplicate || second.ChargeID == first.ChargeID || second.ReceiptID == first.ReceiptID {
		t.Fatalf("placed again: %+v %v", second, err)
	}
	e.Drain(t, h)
	e.RequireState(t, second.ChargeID, ledger.Succeeded)
	e.RequireState(t, second.ReceiptID, ledger.Succeeded)
}

func TestBadOrder(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	if _, err := orders.Place(context.Background(), e.Client, orders.Order{ID: "1004"}); err == nil {
		t.Fatal("an order of nothing was placed")
	}
	e.RequireNoJob(t, "charge-1004")
}
