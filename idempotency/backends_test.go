package idempotency_test

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/idempotency/idemtest"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// The behaviour suite on the default Backend: the table's call records,
// over the emulator (one table for the suite; each test its own function).
func TestBackendDynamoDB(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	db := dynamodb.NewFromConfig(e.Cfg)
	idemtest.Run(t, func(t *testing.T, now func() time.Time) idempotency.Backend {
		st, err := ledger.New(db, e.Table, &ledger.Options{Now: now})
		if err != nil {
			t.Fatal(err)
		}
		return st
	})
}

// The behaviour suite on MemoryBackend.
func TestBackendMemory(t *testing.T) {
	t.Parallel()
	idemtest.Run(t, func(_ *testing.T, now func() time.Time) idempotency.Backend {
		return idempotency.NewMemoryBackend(now)
	})
}
