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

// Provider is the payment provider: Charge charges a card once per
// idempotency key (a repeat of the key returns the first charge), as
// real providers do.
type Provider interface {
	Charge(ctx context.Context, card string, cents int, idempotencyKey string) (chargeID string, err error)
}

// Orders marks orders paid.
type Orders interface {
	MarkPaid(ctx context.Context, orderID, chargeID string) error
}

// Services are what the workers call. Registry uses logging stand-ins.
type Services struct {
	Provider Provider
	Orders   Orders
	Log      *slog.Logger
}

// Registry returns the app's kinds: what the worker runs and the DLQ
// consumer's hooks need.
func Registry() *handler.Registry {
	reg := handler.NewRegistry()
	log := slog.Default()
	RegisterWith(reg, Services{Provider: loggedProvider{log}, Orders: loggedOrders{log}, Log: log})
	return reg
}

// Register adds the app's kinds to reg, with logging stand-ins for the
// provider and the orders.
func Register(reg *handler.Registry, log *slog.Logger) {
	RegisterWith(reg, Services{Provider: loggedProvider{log}, Orders: loggedOrders{log}, Log: log})
}

// charged is the charge step's result, recorded on the job.
type charged struct {
	ChargeID string `json:"chargeId"`
}

// RegisterWith adds the app's kinds to reg. The charge runs as two steps
// (handler.Step): the charge, recorded once it succeeded, and the order
// marked paid. A run that fails, is killed or is taken over after the
// charge replays the recorded charge and only marks the order; a charge
// whose record was lost (throttled past the SDK's retries) is called again
// with the same handler.StepKey, and the provider returns the first
// charge. So the card is charged once and the order paid once.
func RegisterWith(reg *handler.Registry, s Services) {
	handler.AddWorker(reg, handler.WorkFunc[Charge](func(ctx context.Context, j *handler.Job[Charge]) error {
		if strings.HasPrefix(j.Args.Card, "declined") {
			return handler.Permanent(ErrDeclined)
		}
		c, err := handler.Step(ctx, "charge", func(ctx context.Context) (charged, error) {
			id, err := s.Provider.Charge(ctx, j.Args.Card, j.Args.Cents, handler.StepKey(ctx, "charge"))
			return charged{ChargeID: id}, err
		})
		if err != nil {
			return err
		}
		_, err = handler.Step(ctx, "mark-paid", func(ctx context.Context) (bool, error) {
			return true, s.Orders.MarkPaid(ctx, j.Args.OrderID, c.ChargeID)
		})
		return err
	}), &handler.KindOptions{OnDeadLetter: func(ctx context.Context, rec ledger.Record, cause error) error {
		s.Log.WarnContext(ctx, "orders: charge failed; its receipt is cancelled", "job_id", rec.ID, "err", cause)
		return nil
	}})
	handler.AddWorker(reg, handler.WorkFunc[Receipt](func(ctx context.Context, j *handler.Job[Receipt]) error {
		s.Log.InfoContext(ctx, "orders: receipt sent", "job_id", j.ID)
		return nil
	}), nil)
}

// LoggedProvider is a stand-in provider that logs each charge (no card
// data) and names it after its key.
func LoggedProvider(log *slog.Logger) Provider { return loggedProvider{log} }

type loggedProvider struct{ log *slog.Logger }

func (p loggedProvider) Charge(ctx context.Context, _ string, cents int, key string) (string, error) {
	p.log.InfoContext(ctx, "orders: charged", "cents", cents)
	return "ch_" + key, nil
}

type loggedOrders struct{ log *slog.Logger }

func (o loggedOrders) MarkPaid(ctx context.Context, orderID, _ string) error {
	o.log.InfoContext(ctx, "orders: paid")
	return nil
}
