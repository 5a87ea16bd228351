package enqueue_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

type blob struct{ Data string }

func (blob) Kind() string { return "blob" }

type unencodable struct{ F float64 }

func (unencodable) Kind() string { return "unencodable" }

type noKind struct{}

func (noKind) Kind() string { return "" }

// rawKind is a kind a producer mints: control, non-ASCII, bidi.
type rawKind string

func (k rawKind) Kind() string { return string(k) }

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	c := newClient(t, e, nil)
	now := time.Now()
	var nilPayment *payment
	cases := []struct {
		name  string
		args  enqueue.JobArgs
		opts  enqueue.Opts
		field string
	}{
		{"nil args", nil, enqueue.Opts{}, "args"},
		{"nil pointer args", nilPayment, enqueue.Opts{}, "args"},
		{"empty kind", noKind{}, enqueue.Opts{}, "args"},
		{"kind with an escape", rawKind("evil\x1b[2J"), enqueue.Opts{}, "args"},
		{"kind with a newline", rawKind("a\nb"), enqueue.Opts{}, "args"},
		{"non-ASCII kind", rawKind("caf\u00e9"), enqueue.Opts{}, "args"},
		{"kind with a bidi override", rawKind("pay\u202egpj"), enqueue.Opts{}, "args"},
		{"kind over 128 bytes", rawKind(strings.Repeat("k", 129)), enqueue.Opts{}, "args"},
		{"unencodable args", unencodable{F: math.NaN()}, enqueue.Opts{}, "args"},
		{"oversized args", blob{Data: strings.Repeat("x", ledger.MaxArgsBytes)}, enqueue.Opts{}, "args"},
		{"blank key", payment{}, enqueue.Opts{IdempotencyKey: "  \t"}, "IdempotencyKey"},
		{"oversized key", payment{}, enqueue.Opts{IdempotencyKey: strings.Repeat("k", ledger.MaxKeyLen+1)}, "IdempotencyKey"},
		{"invalid UTF-8 key", payment{}, enqueue.Opts{IdempotencyKey: "pay\xff"}, "IdempotencyKey"},
		{"unknown policy", payment{}, enqueue.Opts{IdempotencyKey: "k", DuplicatePolicy: 7}, "DuplicatePolicy"},
		{"negative policy", payment{}, enqueue.Opts{DuplicatePolicy: -1}, "DuplicatePolicy"},
		{"run at in the past", payment{}, enqueue.Opts{RunAt: now.Add(-time.Hour)}, "RunAt"},
		{"delay and run at", payment{}, enqueue.Opts{Delay: time.Minute, RunAt: now.Add(time.Hour)}, "RunAt"},
		{"negative delay", payment{}, enqueue.Opts{Delay: -time.Second}, "Delay"},
		{"delay beyond a year", payment{}, enqueue.Opts{Delay: enqueue.MaxScheduleAhead + time.Hour}, "Delay"},
		{"run at in the year 3000", payment{}, enqueue.Opts{RunAt: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}, "RunAt"},
		{"deadline before run time", payment{}, enqueue.Opts{Delay: time.Hour, Deadline: now.Add(time.Minute)}, "Deadline"},
		{"deadline in the past", payment{}, enqueue.Opts{Deadline: now.Add(-time.Minute)}, "Deadline"},
		{"negative attempts", payment{}, enqueue.Opts{MaxAttempts: -1}, "MaxAttempts"},
	}
	for _, tc := range cases {
		res, err := c.Enqueue(context.Background(), tc.args, &tc.opts)
		var in *enqueue.InputError
		if !errors.As(err, &in) || !errors.Is(err, enqueue.ErrInvalidInput) || in.Field != tc.field {
			t.Errorf("%s: got %+v, %v; want *InputError on %s", tc.name, res, err, tc.field)
		}
	}
	if recs := e.Records(t); len(recs) != 0 {
		t.Errorf("bad input wrote %d records", len(recs))
	}
	if n := e.QueueDepth(t, e.QueueURL); n != 0 {
		t.Errorf("bad input sent %d messages", n)
	}
	// A schedule slightly in the past is within tolerance: it runs now.
	res, err := c.Enqueue(context.Background(), payment{}, &enqueue.Opts{RunAt: now.Add(-time.Second)})
	if err != nil || res.State != ledger.Enqueued {
		t.Errorf("run at within tolerance: %+v %v", res, err)
	}
}

func TestMissingResources(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	if _, err := enqueue.New(e.Cfg, e.Table, "", nil); err == nil {
		t.Error("no queue URL accepted")
	}
	if _, err := enqueue.New(e.Cfg, "", e.QueueURL, nil); err == nil {
		t.Error("no table accepted")
	}
	c := newClient(t, e, nil)
	if err := c.Ping(context.Background()); err != nil {
		t.Fatalf("ping of existing resources: %v", err)
	}
	missing, err := enqueue.New(e.Cfg, e.Table+"-nope", e.QueueURL+"-nope", nil)
	if err != nil {
		t.Fatal(err)
	}
	err = missing.Ping(context.Background())
	var me *enqueue.MissingResourceError
	if !errors.As(err, &me) || me.Resource != e.Table+"-nope" {
		t.Fatalf("ping of a missing table: %v", err)
	}
	_, err = missing.Enqueue(context.Background(), payment{}, nil)
	if !errors.As(err, &me) {
		t.Fatalf("enqueue into a missing table: %v", err)
	}
}

// A FarAfter shorter than enqueue.MinFarAfter is refused: a far message
// fires onetime.Lead before its run time, and the worker's carry of it
// from there must be an SQS delay, not a schedule again.
func TestFarAfterBelowTheLeadIsRefused(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	_, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{FarAfter: time.Minute})
	var in *enqueue.InputError
	if !errors.As(err, &in) || in.Field != "ClientOptions.FarAfter" {
		t.Fatalf("FarAfter 1m: %v, want an *InputError on ClientOptions.FarAfter", err)
	}
	if _, err := enqueue.New(e.Cfg, e.Table, e.QueueURL, &enqueue.ClientOptions{FarAfter: enqueue.MinFarAfter}); err != nil {
		t.Fatalf("FarAfter %s: %v", enqueue.MinFarAfter, err)
	}
}
