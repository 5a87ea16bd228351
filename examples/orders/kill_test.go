package orders_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/provision"
)

// The worker process the kill test starts: the env variables name its
// table, its queue, the provider's URL and the file it writes once it
// charged and is about to mark the order paid (where it then hangs until
// it is killed).
const (
	envChild    = "ORDERS_KILL_CHILD"
	envTable    = "ORDERS_KILL_TABLE"
	envSteps    = "ORDERS_KILL_STEPS" // the steps table: the charge's refund is a compensation
	envQueue    = "ORDERS_KILL_QUEUE"
	envProvider = "ORDERS_KILL_PROVIDER"
	envHeld     = "ORDERS_KILL_HELD"
)

func init() {
	if os.Getenv(envChild) != "" {
		childWorker() // never returns: the test kills it
	}
}

// httpProvider is the provider across processes: the parent's counting
// fake, over HTTP.
type httpProvider struct{ url string }

func (p httpProvider) Charge(ctx context.Context, card string, cents int, key string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"?key="+url.QueryEscape(key), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }() // a read body's close fails only on a broken connection, which Decode met first
	var out struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", err
	}
	return out.ID, nil
}

// hangingOrders writes the held file and hangs: the process is killed
// between the charge step and the mark-paid step.
type hangingOrders struct{ held string }

func (o hangingOrders) MarkPaid(context.Context, string, string) error {
	_ = os.WriteFile(o.held, []byte("charged"), 0o600)
	select {}
}

func childWorker() {
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	reg := handler.NewRegistry()
	orders.RegisterWith(reg, orders.Services{Provider: httpProvider{os.Getenv(envProvider)}, Orders: hangingOrders{os.Getenv(envHeld)}, Log: quietLog})
	h, err := handler.New(cfg, os.Getenv(envTable), os.Getenv(envQueue), reg, &handler.Options{Logger: quietLog, Lease: time.Minute, Ledger: ledger.Options{StepsTable: os.Getenv(envSteps)}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	_ = poller.New(sqs.NewFromConfig(cfg), os.Getenv(envQueue), h.Handle, &poller.Options{WaitTime: time.Second, FunctionTimeout: time.Minute, Logger: quietLog}).Run(context.Background())
	os.Exit(3)
}

// TestChargedOnceWhenTheWorkerIsKilled: the worker process is SIGKILLed
// between the charge step and the mark-paid step (the seed's "throws
// after the charge succeeds but before it marks the order as paid", at
// its worst). The job is an orphan; once its lease runs out another
// worker takes it over, replays the recorded charge without calling the
// provider, and marks the order paid: one charge, one provider call, the
// order paid with it.
func TestChargedOnceWhenTheWorkerIsKilled(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, &nexjobtest.Options{Queue: provision.QueueSpec{VisibilityTimeout: 2 * time.Second}})
	provider := &fakeProvider{charges: map[string]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := provider.Charge(r.Context(), "", 0, r.URL.Query().Get("key"))
		_ = json.NewEncoder(w).Encode(struct{ ID string }{id})
	}))
	defer srv.Close()

	placed, err := orders.Place(context.Background(), e.Client, orders.Order{ID: "1001", Cents: 4200, Card: "tok_visa", Email: "ada@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	held := filepath.Join(t.TempDir(), "held")
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), envChild+"=1", envTable+"="+e.Table, envSteps+"="+e.StepsTable, envQueue+"="+e.QueueURL, envProvider+"="+srv.URL, envHeld+"="+held)
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill := func() { once.Do(func() { _ = child.Process.Kill(); _ = child.Wait() }) }
	defer kill()
	for end := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(held); err == nil {
			break // charged, about to mark the order
		}
		if time.Now().After(end) {
			t.Fatal("the worker process never charged")
		}
	}
	kill()
	rec := e.Get(t, placed.ChargeID)
	if rec.State != ledger.Processing || rec.Steps["charge"] == "" {
		t.Fatalf("after the kill: %s with steps %v; want Processing with the charge recorded", rec.State, rec.Steps)
	}

	paid := &fakeOrders{paid: map[string]string{}}
	reg := handler.NewRegistry()
	orders.RegisterWith(reg, orders.Services{Provider: provider, Orders: paid, Log: quietLog})
	e.Advance(t, ledger.Millis(rec.LeaseUntil).Sub(e.Now())+time.Second) // the killed worker's lease ran out
	second := e.Handler(t, reg, &handler.Options{Logger: quietLog})
	for e.Get(t, placed.ChargeID).State != ledger.Succeeded {
		e.Drain(t, second) // the killed worker's message comes back after the queue's visibility timeout
	}
	provider.mu.Lock()
	defer provider.mu.Unlock()
	var charge string
	for _, id := range provider.charges {
		charge = id
	}
	if len(provider.charges) != 1 || provider.calls != 1 || paid.calls != 1 || paid.paid["1001"] != charge {
		t.Fatalf("%d charges in %d provider calls, %d marks, order paid with %q; want 1 charge in 1 call, paid once with it",
			len(provider.charges), provider.calls, paid.calls, paid.paid["1001"])
	}
}
