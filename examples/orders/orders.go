// Package orders is an example app built only on nexjob-aws's public API:
// placing an order charges the card and, once the charge succeeded, sends
// the receipt (a continuation). Both are idempotent by order id.
//
// The charge job is a durable workflow: it reserves the order's items in
// parallel (handler.Map, each item a step), charges the card under a
// step retry policy (handler.StepWith: a provider that is down is tried
// again in the run, a declined card is not), declares the refund as the
// charge's compensation (handler.Compensate), marks the order paid, and
// ships it as a child job whose label it awaits (handler.Invoke). A
// cancel of the order while it waits for shipping, or a failure for good
// after the charge, refunds the card once.
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
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Charge charges an order's card.
type Charge struct {
	OrderID string `json:"orderId"`
	Cents   int    `json:"cents"`
	Card    string `json:"card"` // a token from the payment provider
	Items   []Item `json:"items,omitempty"`
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

// Ship ships a paid order: a child job of its charge, whose label the
// charge awaits.
type Ship struct {
	OrderID string `json:"orderId"`
}

// Kind is the job kind.
func (Ship) Kind() string { return "orders.ship" }

// Label is a shipment's label: the Ship job's result.
type Label struct {
	Tracking string `json:"tracking"`
}

// Item is a line of an order.
type Item struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// Order is what a customer places.
type Order struct {
	ID    string `json:"id"`
	Cents int    `json:"cents"`
	Card  string `json:"card"`
	Email string `json:"email"`
	Items []Item `json:"items,omitempty"`
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
	charge, err := c.Enqueue(ctx, Charge{OrderID: o.ID, Cents: o.Cents, Card: o.Card, Items: o.Items}, &enqueue.Opts{IdempotencyKey: "charge-" + o.ID})
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

// Refunder refunds a charge, once per idempotency key.
type Refunder interface {
	Refund(ctx context.Context, chargeID, idempotencyKey string) error
}

// Warehouse reserves an order's items and ships orders.
type Warehouse interface {
	Reserve(ctx context.Context, orderID string, item Item) (string, error)
	Ship(ctx context.Context, orderID string) (Label, error)
}

// Services are what the workers call. Registry uses logging stand-ins;
// a nil Refunds or Warehouse is a logging stand-in too.
type Services struct {
	Provider  Provider
	Orders    Orders
	Refunds   Refunder
	Warehouse Warehouse
	Log       *slog.Logger
}

// ErrProviderDown is a provider that did not answer: the charge step
// tries it again in the run (its retry policy); a declined card is not.
var ErrProviderDown = errors.New("payment provider unavailable")

// chargeRetries is the charge step's own retry policy.
var chargeRetries = &handler.StepOptions{
	MaxAttempts: 3,
	Backoff:     func(n int) time.Duration { return time.Duration(n) * 100 * time.Millisecond },
	Retryable:   func(err error) bool { return errors.Is(err, ErrProviderDown) },
}

// ShipWait is how long a charge waits for its shipping child.
const ShipWait = 48 * time.Hour

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
	if s.Refunds == nil {
		s.Refunds = loggedRefunds{s.Log}
	}
	if s.Warehouse == nil {
		s.Warehouse = loggedWarehouse{s.Log}
	}
	handler.AddWorker(reg, handler.WorkFunc[Charge](func(ctx context.Context, j *handler.Job[Charge]) error {
		if strings.HasPrefix(j.Args.Card, "declined") {
			return handler.Permanent(ErrDeclined)
		}
		if len(j.Args.Items) > 0 {
			// Each item reserved once, five at a time; a retry reserves
			// only the items not yet reserved.
			if _, err := handler.Map(ctx, "reserve", j.Args.Items, func(ctx context.Context, _ int, it Item) (string, error) {
				return s.Warehouse.Reserve(ctx, j.Args.OrderID, it)
			}, &handler.MapOptions{MaxConcurrency: 5}); err != nil {
				return err
			}
		}
		c, err := handler.StepWith(ctx, "charge", chargeRetries, func(ctx context.Context) (charged, error) {
			id, err := s.Provider.Charge(ctx, j.Args.Card, j.Args.Cents, handler.StepKey(ctx, "charge"))
			return charged{ChargeID: id}, err
		})
		if err != nil {
			return err
		}
		// From here on, a cancel or a failure for good refunds the card.
		if err := handler.Compensate(ctx, "refund", func(ctx context.Context) error {
			return s.Refunds.Refund(ctx, c.ChargeID, handler.StepKey(ctx, "refund"))
		}); err != nil {
			return err
		}
		if _, err = handler.Step(ctx, "mark-paid", func(ctx context.Context) (bool, error) {
			return true, s.Orders.MarkPaid(ctx, j.Args.OrderID, c.ChargeID)
		}); err != nil {
			return err
		}
		if len(j.Args.Items) == 0 {
			return nil // nothing to ship
		}
		// Shipping is a job of its own, awaited for its label: the run
		// sleeps meanwhile (return Invoke's error as Sleep's).
		_, err = handler.Invoke[Label](ctx, "ship", Ship{OrderID: j.Args.OrderID}, &handler.InvokeOptions{Timeout: ShipWait})
		var late *handler.ChildTimeoutError
		if errors.As(err, &late) {
			return handler.Permanent(err) // not shipped in time: refunded
		}
		return err
	}), &handler.KindOptions{OnDeadLetter: func(ctx context.Context, rec ledger.Record, cause error) error {
		s.Log.WarnContext(ctx, "orders: charge failed; its receipt is cancelled", "job_id", rec.ID, "err", cause)
		return nil
	}})
	handler.AddWorker(reg, handler.WorkFunc[Receipt](func(ctx context.Context, j *handler.Job[Receipt]) error {
		s.Log.InfoContext(ctx, "orders: receipt sent", "job_id", j.ID)
		return nil
	}), nil)
	handler.AddWorkerResult(reg, handler.ResultFunc[Ship, Label](func(ctx context.Context, j *handler.Job[Ship]) (Label, error) {
		return s.Warehouse.Ship(ctx, j.Args.OrderID)
	}), nil)
}

type loggedRefunds struct{ log *slog.Logger }

func (r loggedRefunds) Refund(ctx context.Context, _, _ string) error {
	r.log.InfoContext(ctx, "orders: refunded")
	return nil
}

type loggedWarehouse struct{ log *slog.Logger }

func (w loggedWarehouse) Reserve(ctx context.Context, _ string, it Item) (string, error) {
	w.log.InfoContext(ctx, "orders: reserved", "sku", it.SKU)
	return "res-" + it.SKU, nil
}

func (w loggedWarehouse) Ship(ctx context.Context, orderID string) (Label, error) {
	w.log.InfoContext(ctx, "orders: shipped")
	return Label{Tracking: "TRK-" + orderID}, nil
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
