package soak

import (
	"strings"
	"testing"

	"github.com/nexjob/nexjob-aws/ledger"
)

// TestConcurrencyViolations: the checker counts overlapping runs of one
// tenant's limited jobs from the run logs: three at once is one over the
// limit of two; back to back is no overlap; other tenants and runs with no
// logged end do not count.
func TestConcurrencyViolations(t *testing.T) {
	recs := []ledger.Record{
		{ID: "a", Kind: "soak.limited", Args: `{"N":1,"Tenant":"t0"}`},
		{ID: "b", Kind: "soak.limited", Args: `{"N":2,"Tenant":"t0"}`},
		{ID: "c", Kind: "soak.limited", Args: `{"N":3,"Tenant":"t0"}`},
		{ID: "d", Kind: "soak.limited", Args: `{"N":4,"Tenant":"t1"}`},
	}
	rs := runs{byJob: map[string][]*run{
		"a": {{id: "a", start: 0, end: 10}},
		"b": {{id: "b", start: 10, end: 20}}, // back to back with a
		"c": {{id: "c", start: 5, end: 0}},   // killed: no end logged
		"d": {{id: "d", start: 0, end: 30}},
	}}
	if bad := concurrencyViolations(recs, rs); len(bad) != 0 {
		t.Fatalf("no overlap beyond the limit, got %v", bad)
	}
	rs.byJob["c"] = []*run{{id: "c", start: 5, end: 15}}
	rs.byJob["b"] = []*run{{id: "b", start: 8, end: 20}}
	bad := concurrencyViolations(recs, rs)
	if len(bad) != 1 || !strings.Contains(bad[0], "tenant t0: 3 runs") {
		t.Fatalf("a, b and c overlap at 8..10: got %v", bad)
	}
}
