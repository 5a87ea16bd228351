package ledger_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestCallRecordsAreUnderTheirFunction: a call's record is kept under
// its function's prefix, "i#<function>#" (what a grant's
// dynamodb:LeadingKeys names), and BeginCall refuses a key hash that
// names no function (ErrCallKeyUnscoped), writing nothing.
func TestCallRecordsAreUnderTheirFunction(t *testing.T) {
	t.Parallel()
	e := awstest.New(t, nil)
	s, err := ledger.New(e.DB, e.Table, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kh := ledger.CallKey("payments", s.HashKey("order-1"))
	if _, began, err := s.BeginCall(ctx, kh, "", ledger.RejectAlways, time.Now().Add(time.Minute), time.Second, time.Hour); err != nil || !began {
		t.Fatalf("begin: %v %v", began, err)
	}
	out, err := e.DB.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(e.Table), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range out.Items {
		if pk := it[ledger.AttrPK].(*types.AttributeValueMemberS).Value; strings.HasPrefix(pk, ledger.CallKeyPrefix) && !strings.HasPrefix(pk, ledger.FunctionCallPrefix("payments")) {
			t.Errorf("the call's record is under %q, not its function's prefix %s", pk, ledger.FunctionCallPrefix("payments"))
		}
	}
	c, ok, err := s.GetCall(ctx, kh)
	if err != nil || !ok || c.KeyHash != kh || !strings.HasPrefix(ledger.CallKeyPrefix+c.KeyHash, ledger.FunctionCallPrefix("payments")) {
		t.Fatalf("the record: %+v %v %v; want it under %s", c, ok, err, ledger.FunctionCallPrefix("payments"))
	}
	for _, bad := range []string{s.HashKey("order-2"), "#" + s.HashKey("order-2"), "payments#"} {
		if _, _, err := s.BeginCall(ctx, bad, "", ledger.RejectAlways, time.Now().Add(time.Minute), time.Second, time.Hour); !errors.Is(err, ledger.ErrCallKeyUnscoped) {
			t.Errorf("BeginCall(%q): %v; want ErrCallKeyUnscoped", bad, err)
		}
		if _, ok, err := s.GetCall(ctx, bad); err != nil || ok {
			t.Errorf("BeginCall(%q) wrote a record: %v %v", bad, ok, err)
		}
	}
}
