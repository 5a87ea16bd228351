// Package orders is an example app built only on nexjob-aws's public API:
// placing an order charges the card and, once the charge succeeded, sends
// the receipt (a continuation). Both are idempotent by order id.
//
// A declined card fails the charge at once (handler.Permanent); its
// receipt then ends Failed with it, and placing the order again charges
// and sends a receipt anew.
package orders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Charge charges an order's card.
type Charge struct {
	OrderID string `json:"orderId"`
	Cents   int    `json:"cents"`
	Card    string `json:"card"` // a token from the payment provider
}

// Kind is the job kind.
func (Charge) Kind() string { return "orders.charge" }

// Receipt mails an order's receipt.
type Receipt struct {
	OrderID string `json:"orderId"`
	Email   string `json:"email"`
}

// Kind is the job kind.
func (Receipt) Kind() string { return "orders.receipt" }

// Order is what a customer places.
type Order struct {
	ID    string `json:"id"`
	Cents int    `json:"cents"`
	Card  string `json:"card"`
	Email string `json:"email"`
}

// Placed says which jobs an order has.
type Placed struct {
	ChargeID  string `json:"chargeId"`
	ReceiptID string `json:"receiptId"`
	Duplicate bool   `json:"duplicate"` // the order was already placed and is still going
}

// ErrDeclined is a card the provider refuses.
var ErrDeclined = errors.New("card declined")

// Place enqueues the order's charge and its receipt as a continuation.
// Placing the same order again while it is going returns its jobs; after
// it failed, it is charged anew (the default DuplicatePolicy).
func Place(ctx context.Context, c *enqueue.Client, o Order) (Placed, error) {
	if o.ID == "" || o.Cents <= 0 {
		return Placed{}, fmt.Errorf("orders: an order needs an id and a positive amount")
	}
	charge, err := c.Enqueue(ctx, Charge{OrderID: o.ID, Cents: o.Cents, Card: o.Card}, &enqueue.Opts{IdempotencyKey: "charge-" + o.ID})
	if err != nil {
		return Placed{}, err
	}
	receipt, err := c.ContinueWith(ctx, charge.ID, Receipt{OrderID: o.ID, Email: o.Email}, &enqueue.Opts{IdempotencyKey: "receipt-" + o.ID})
	if err != nil {
		return Placed{ChargeID: charge.ID}, err
	}
	return Placed{ChargeID: charge.ID, ReceiptID: receipt.ID, Duplicate: charge.Duplicate}, nil
}

// Registry returns the app's kinds: what the worker runs and the DLQ
// consumer's hooks need.
func Registry() *handler.Registry {
	reg := handler.NewRegistry()
	Register(reg, slog.Default())
	return reg
}

// Register adds the app's kinds to reg.
func Register(reg *handler.Registry, log *slog.Logger) {
	handler.AddWorker(reg, handler.WorkFunc[Charge](func(ctx context.Context, j *handler.Job[Charge]) error {
		if strings.HasPrefix(j.Args.Card, "declined") {
			return handler.Permanent(ErrDeclined)
		}
		// A real provider call goes here, with the job's key as its
		// idempotency key so a repeat of the run charges once.
		log.InfoContext(ctx, "orders: charged", "job_id", j.ID, "cents", j.Args.Cents)
		return nil
	}), &handler.KindOptions{OnDeadLetter: func(ctx context.Context, rec ledger.Record, cause error) error {
		log.WarnContext(ctx, "orders: charge failed; its receipt is cancelled", "job_id", rec.ID, "err", cause)
		return nil
	}})
	handler.AddWorker(reg, handler.WorkFunc[Receipt](func(ctx context.Context, j *handler.Job[Receipt]) error {
		log.InfoContext(ctx, "orders: receipt sent", "job_id", j.ID)
		return nil
	}), nil)
}
