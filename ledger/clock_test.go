package ledger_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/ledger"
)

// clockedStore is a Store on db's table whose clock stands at start and
// moves only when the test adds to the returned nanoseconds.
func clockedStore(t *testing.T, db ledger.DynamoDB, table string, start time.Time) (*ledger.Store, *atomic.Int64) {
	t.Helper()
	now := new(atomic.Int64)
	now.Store(start.UnixNano())
	s, err := ledger.New(db, table, &ledger.Options{Now: func() time.Time { return time.Unix(0, now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	return s, now
}
