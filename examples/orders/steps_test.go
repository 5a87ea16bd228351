package orders_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakeProvider charges once per idempotency key, as real providers do,
// and counts the calls and the charges.
type fakeProvider struct {
	mu      sync.Mutex
	calls   int
	charges map[string]string // key to charge id
}

func (p *fakeProvider) Charge(_ context.Context, _ string, _ int, key string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if id, ok := p.charges[key]; ok {
		return id, nil
	}
	id := "ch_" + key
	p.charges[key] = id
	return id, nil
}

// fakeOrders marks orders paid, idempotently (a second mark of an order
// keeps the first charge), and counts the calls; block, if set, holds the
// first MarkPaid until it is closed (a run stuck, or killed, between the
// charge and the mark).
type fakeOrders struct {
	mu    sync.Mutex
	calls int
	paid  map[string]string // order to charge id
	block chan struct{}
	held  chan struct{}
}

func (o *fakeOrders) MarkPaid(ctx context.Context, orderID, chargeID string) error {
	o.mu.Lock()
	block := o.block
	o.block = nil
	o.mu.Unlock()
	if block != nil {
		close(o.held)
		<-block
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls++
	if _, ok := o.paid[orderID]; !ok {
		o.paid[orderID] = chargeID
	}
	return nil
}

// charging is the app over a kit Env whose worker's requests go through a
// fault transport.
type charging struct {
	e        *nexjobtest.Env
	ft       *faults.Transport
	provider *fakeProvider
	orders   *fakeOrders
	reg      *handler.Registry
}

func newCharging(t *testing.T) *charging {
	e := nexjobtest.New(t, nil)
	c := &charging{e: e, ft: faults.New(nil), provider: &fakeProvider{charges: map[string]string{}}, orders: &fakeOrders{paid: map[string]string{}}}
	e.Cfg = faults.Config(e.Cfg, c.ft)
	c.reg = handler.NewRegistry()
	orders.RegisterWith(c.reg, orders.Services{Provider: c.provider, Orders: c.orders, Log: quietLog})
	return c
}

// charged places order 1001 and runs it to its end (moving the kit's
// clock over retries), then checks one charge and one payment.
func (c *charging) placeAndCheck(t *testing.T, h *handler.Handler, calls int) {
	t.Helper()
	placed, err := orders.Place(context.Background(), c.e.Client, orders.Order{ID: "1001", Cents: 4200, Card: "tok_visa", Email: "ada@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		c.e.Drain(t, h)
		if rec := c.e.Get(t, placed.ChargeID); rec.State.Terminal() {
			break
		}
		c.e.RunNow(t, placed.ChargeID)
	}
	c.check(t, placed.ChargeID, calls)
}

func (c *charging) check(t *testing.T, chargeID string, calls int) {
	t.Helper()
	rec := c.e.Get(t, chargeID)
	c.provider.mu.Lock()
	defer c.provider.mu.Unlock()
	c.orders.mu.Lock()
	defer c.orders.mu.Unlock()
	var charge string
	for _, id := range c.provider.charges {
		charge = id
	}
	if rec.State != ledger.Succeeded || len(c.provider.charges) != 1 || c.provider.calls != calls || c.orders.paid["1001"] != charge {
		t.Fatalf("charge job %s; %d charges in %d provider calls, order paid with %q; want Succeeded, 1 charge in %d calls, paid with it",
			rec.State, len(c.provider.charges), c.provider.calls, c.orders.paid["1001"], calls)
	}
}

// The charge step's write applied and its reply lost, or timed out: it
// reads as done, and the provider is called once. Throttled past the
// SDK's retries: the run fails and the retry calls the provider again,
// with the same StepKey, and the provider returns the first charge.
func TestChargedOnceThroughTheStepsFaults(t *testing.T) {
	t.Parallel()
	// The step's item in the steps table (ledger.Options.StepsTable, as
	// the construct and the kit deploy it): its sort key "0/charge".
	isCharge := func(body []byte) bool { return strings.Contains(string(body), `"0/charge"`) }
	for _, c := range []struct {
		name  string
		rule  faults.Rule
		calls int
	}{
		{"lost reply", faults.Rule{Op: "DynamoDB.PutItem", Match: isCharge, Fault: faults.LostReply}, 1},
		{"timeout", faults.Rule{Op: "DynamoDB.PutItem", Match: isCharge, Fault: faults.Timeout}, 1},
		{"throttled past the retries", faults.Rule{Op: "DynamoDB.PutItem", Match: isCharge, Fault: faults.Throttle, Times: faults.Attempts}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ch := newCharging(t)
			fault := ch.ft.Add(c.rule)
			ch.placeAndCheck(t, ch.e.Handler(t, ch.reg, &handler.Options{Logger: quietLog}), c.calls)
			if fault.Fired() == 0 {
				t.Fatal("the fault never fired")
			}
		})
	}
}

// A run charges and then hangs before marking the order paid (its worker
// stuck, or killed: its lease runs out); a second worker takes the job
// over, replays the recorded charge and marks the order paid. The stuck
// run's late mark is the same idempotent mark and its end is refused
// (fenced). One charge, the order paid with it.
func TestChargedOnceWhenARunIsTakenOver(t *testing.T) {
	t.Parallel()
	ch := newCharging(t)
	block := make(chan struct{})
	ch.orders.block, ch.orders.held = block, make(chan struct{})
	placed, err := orders.Place(context.Background(), ch.e.Client, orders.Order{ID: "1001", Cents: 4200, Card: "tok_visa", Email: "ada@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	first := ch.e.Handler(t, ch.reg, &handler.Options{Logger: quietLog, Lease: time.Minute})
	stuck := make(chan struct{})
	go func() { defer close(stuck); ch.e.Drain(t, first) }()
	<-ch.orders.held // charged; the mark is held
	lease := ledger.Millis(ch.e.Get(t, placed.ChargeID).LeaseUntil).Sub(ch.e.Now())
	ch.e.Advance(t, lease+time.Second) // its lease ran out: an orphan
	second := ch.e.Handler(t, ch.reg, &handler.Options{Logger: quietLog, Lease: time.Minute})
	for ch.e.Get(t, placed.ChargeID).State != ledger.Succeeded {
		ch.e.Drain(t, second) // the orphan's message comes back after the queue's visibility timeout
	}
	close(block) // the first run marks the order (idempotent) and its end is refused
	<-stuck
	ch.check(t, placed.ChargeID, 1)
	if ch.orders.calls != 2 {
		t.Fatalf("MarkPaid called %d times, want 2 (the stuck run's and the take-over's)", ch.orders.calls)
	}
}
