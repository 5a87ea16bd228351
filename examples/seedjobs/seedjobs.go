// Package seedjobs holds the three jobs of the user's idempotency document
// (payment, welcome email, webhook delivery) as nexjob-aws jobs. The demo
// (make run) and the example Lambda worker register them.
//
// They call no real service: a payment "fails" for its first
// SimulateFailures attempts (a provider time-out), and a webhook to a host
// under .invalid never answers. Each worker shows the guard that makes a
// job internally idempotent.
package seedjobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
)

// Payment charges an order once.
type Payment struct {
	OrderID          string `json:"orderId"`
	AmountCents      int64  `json:"amountCents"`
	SimulateFailures int    `json:"simulateFailures,omitempty"`
}

// Kind names the job.
func (Payment) Kind() string { return "payment" }

// WelcomeEmail greets a new user.
type WelcomeEmail struct {
	UserID string `json:"userId"`
	Email  string `json:"email"`
}

// Kind names the job.
func (WelcomeEmail) Kind() string { return "welcome-email" }

// Webhook delivers an event to a subscriber.
type Webhook struct {
	URL     string `json:"url"`
	EventID string `json:"eventId"`
}

// Kind names the job.
func (Webhook) Kind() string { return "webhook" }

// Charges stands in for a payment provider that honours its own
// idempotency key (the order id): charging twice is a no-op.
type Charges struct {
	mu     sync.Mutex
	orders map[string]int64
}

// Charge records the charge unless the order was charged already.
func (c *Charges) Charge(orderID string, cents int64) (charged bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.orders == nil {
		c.orders = map[string]int64{}
	}
	if _, ok := c.orders[orderID]; ok {
		return false
	}
	c.orders[orderID] = cents
	return true
}

// Register adds the three workers. backoff replaces the default retry
// backoff when not nil (the demo uses a short one).
func Register(reg *handler.Registry, charges *Charges, log *slog.Logger, backoff func(int) time.Duration) {
	opts := &handler.KindOptions{Backoff: backoff}
	handler.AddWorker(reg, handler.WorkFunc[Payment](func(ctx context.Context, j *handler.Job[Payment]) error {
		if j.Attempt <= j.Args.SimulateFailures {
			return errors.New("payment provider timed out (simulated)")
		}
		// Guard: the provider's own idempotency key makes a repeat harmless.
		if !charges.Charge(j.Args.OrderID, j.Args.AmountCents) {
			log.InfoContext(ctx, "payment already charged", "job_id", j.ID)
		}
		return nil
	}), opts)
	handler.AddWorker(reg, handler.WorkFunc[WelcomeEmail](func(ctx context.Context, j *handler.Job[WelcomeEmail]) error {
		if !strings.Contains(j.Args.Email, "@") {
			return handler.Permanent(errors.New("not an email address"))
		}
		log.InfoContext(ctx, "welcome email sent", "job_id", j.ID) // never the address
		return nil
	}), opts)
	handler.AddWorker(reg, handler.WorkFunc[Webhook](func(ctx context.Context, j *handler.Job[Webhook]) error {
		u, err := url.Parse(j.Args.URL)
		if err != nil {
			return handler.Permanent(fmt.Errorf("bad webhook URL: %w", err))
		}
		if strings.HasSuffix(u.Hostname(), ".invalid") {
			// The error names no part of the input: errors reach logs.
			return errors.New("subscriber endpoint refused the connection (simulated)")
		}
		return nil
	}), opts)
}
