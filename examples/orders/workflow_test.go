package orders_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// shop is a counting provider, refunder and warehouse: what the workflow
// asked of each, by key.
type shop struct {
	mu        sync.Mutex
	charges   map[string]int // by idempotency key
	refunds   map[string]int // by charge
	reserved  map[string]int // by SKU
	shipped   int
	down      int  // the provider's next calls that fail as down
	holdShips bool // the warehouse does not ship (a cancel comes first)
}

func newShop() *shop {
	return &shop{charges: map[string]int{}, refunds: map[string]int{}, reserved: map[string]int{}}
}

func (s *shop) Charge(_ context.Context, _ string, _ int, key string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down > 0 {
		s.down--
		return "", orders.ErrProviderDown
	}
	s.charges[key]++
	return "ch_" + key, nil
}

func (s *shop) Refund(_ context.Context, chargeID, _ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refunds[chargeID]++
	return nil
}

func (s *shop) Reserve(_ context.Context, _ string, it orders.Item) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reserved[it.SKU]++
	return "res-" + it.SKU, nil
}

func (s *shop) Ship(_ context.Context, orderID string) (orders.Label, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holdShips {
		return orders.Label{}, errors.New("the truck is late")
	}
	s.shipped++
	return orders.Label{Tracking: "TRK-" + orderID}, nil
}

type paidOrders struct{}

func (paidOrders) MarkPaid(context.Context, string, string) error { return nil }

func shopHandler(t *testing.T, e *nexjobtest.Env, s *shop) *handler.Handler {
	reg := handler.NewRegistry()
	orders.RegisterWith(reg, orders.Services{Provider: s, Orders: paidOrders{}, Refunds: s, Warehouse: s, Log: quietLog})
	return e.Handler(t, reg, &handler.Options{Logger: quietLog})
}

// The whole workflow: the items reserved in parallel, each once; the
// provider down twice, tried again in the run (the step's retry policy,
// no attempt of the job spent); the order shipped as a child job whose
// label the charge awaited; no refund.
func TestOrderWorkflowReservesChargesAndShips(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	s := newShop()
	s.down = 2
	items := []orders.Item{{SKU: "mug", Qty: 1}, {SKU: "tea", Qty: 3}, {SKU: "spoon", Qty: 2}}
	placed, err := orders.Place(context.Background(), e.Client, orders.Order{ID: "2001", Cents: 2500, Card: "tok_visa", Email: "ada@example.com", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, shopHandler(t, e, s))
	charge := e.RequireState(t, placed.ChargeID, ledger.Succeeded)
	e.RequireState(t, placed.ReceiptID, ledger.Succeeded)
	s.mu.Lock()
	defer s.mu.Unlock()
	if charge.Attempt != 1 || len(s.charges) != 1 || s.shipped != 1 || len(s.refunds) != 0 {
		t.Fatalf("attempt %d, charges %v, shipped %d, refunds %v; want 1 attempt, one charge, one shipment, no refund", charge.Attempt, s.charges, s.shipped, s.refunds)
	}
	for _, it := range items {
		if s.reserved[it.SKU] != 1 {
			t.Errorf("%s reserved %d times", it.SKU, s.reserved[it.SKU])
		}
	}
	if charge.ChildEnds != 1 {
		t.Errorf("the charge counted %d child ends, want its shipment's", charge.ChildEnds)
	}
}

// Cancelled while it waits for shipping, the order is refunded once: the
// charge job runs its compensation and ends Failed, cancelled; its
// shipment is cancelled with it.
func TestOrderCancelledWhileShippingIsRefunded(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	s := newShop()
	s.holdShips = true
	placed, err := orders.Place(context.Background(), e.Client, orders.Order{ID: "2002", Cents: 900, Card: "tok_visa", Email: "bo@example.com", Items: []orders.Item{{SKU: "mug", Qty: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	h := shopHandler(t, e, s)
	e.DrainNow(t, h) // charged, waiting for its shipment, which keeps failing
	_, err = e.Client.Cancel(context.Background(), placed.ChargeID, "customer cancelled", 0)
	var asked *enqueue.CancelRequestedError
	if !errors.As(err, &asked) {
		t.Fatalf("Cancel: %v, want a *CancelRequestedError (the charge refunds first)", err)
	}
	e.DrainNow(t, h)
	charge := e.RequireState(t, placed.ChargeID, ledger.Failed)
	if !charge.Cancelled {
		t.Fatalf("the charge ended %s, not cancelled (%s)", charge.State, charge.LastError)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.charges) != 1 || len(s.refunds) != 1 || s.shipped != 0 {
		t.Fatalf("charges %v, refunds %v, shipped %d; want one charge refunded once, nothing shipped", s.charges, s.refunds, s.shipped)
	}
	for _, n := range s.refunds {
		if n != 1 {
			t.Fatalf("refunded %d times", n)
		}
	}
}
