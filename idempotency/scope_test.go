package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/settings"
)

// TestFunctionsNeverShareRecords: two functions of one deployment (the
// construct's GrantIdempotency gives each its name in
// NEXJOB_IDEMPOTENCY_FUNCTION) using one key hold two records, each under
// its own function's partition key prefix "i#<function>#" (which the
// function's grant, and only its grant, reaches: IAM's
// dynamodb:LeadingKeys), and a store of one function calling itself
// another is refused, so it can neither record first under the other's
// name nor reach its records. Not parallel: it sets the environment.
func TestFunctionsNeverShareRecords(t *testing.T) {
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	store := func(deployed, function string) (*idempotency.Store, error) {
		t.Setenv("AWS_LAMBDA_FUNCTION_NAME", deployed) // as Lambda sets it
		t.Setenv(idempotency.EnvFunction, deployed)
		return idempotency.New(e.Cfg, e.Table, &idempotency.Options{Function: function, Ledger: ledger.Options{Now: e.Now}})
	}
	if idempotency.EnvFunction != settings.EnvIdempotencyFunction {
		t.Fatalf("idempotency reads %s, the construct sets %s", idempotency.EnvFunction, settings.EnvIdempotencyFunction)
	}
	payments, err := store("payments", "")
	if err != nil {
		t.Fatal(err)
	}
	refunds, err := store("refunds", "")
	if err != nil {
		t.Fatal(err)
	}
	receipt := func(s string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return s, nil }
	}
	// One key, two functions: two records, each replaying its own.
	p, err := idempotency.Do(ctx, payments, "order-1", receipt("paid"), nil)
	if err != nil || p.Replayed {
		t.Fatalf("payments' first call: %+v %v", p, err)
	}
	r, err := idempotency.Do(ctx, refunds, "order-1", receipt("refunded"), nil)
	if err != nil || r.Replayed {
		t.Errorf("refunds' first call with the same key: %+v %v; want a run of its own", r, err)
	}
	if again, err := idempotency.Do(ctx, payments, "order-1", receipt("paid twice"), nil); err != nil || !again.Replayed || again.Value != "paid" {
		t.Errorf("payments' repeat: %+v %v; want its own receipt replayed", again, err)
	}
	// Every call record sits under its function's prefix.
	out, err := e.DB.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(e.Table)})
	if err != nil {
		t.Fatal(err)
	}
	under := map[string]int{}
	for _, it := range out.Items {
		pk := it[ledger.AttrPK].(*types.AttributeValueMemberS).Value
		if !strings.HasPrefix(pk, ledger.CallKeyPrefix) {
			continue
		}
		switch {
		case strings.HasPrefix(pk, ledger.CallKeyPrefix+"payments#"):
			under["payments"]++
		case strings.HasPrefix(pk, ledger.CallKeyPrefix+"refunds#"):
			under["refunds"]++
		default:
			t.Errorf("a call record's key %q is under no function's prefix (%spayments# or %srefunds#): one grant reaches every function's records", pk, ledger.CallKeyPrefix, ledger.CallKeyPrefix)
		}
	}
	if under["payments"] != 1 || under["refunds"] != 1 {
		t.Errorf("call records by function: %v; want one each", under)
	}
	// The refunds function's deployment calling itself payments: refused.
	forger, err := store("refunds", "payments")
	var fe *idempotency.FunctionError
	if err != nil && (!errors.As(err, &fe) || fe.Function != "payments" || fe.Deployed != "refunds") {
		t.Errorf("the refused store's error: %v; want a *FunctionError naming payments and the deployment's refunds", err)
	}
	if err == nil {
		if _, err := idempotency.Do(ctx, forger, "order-2", receipt("forged"), nil); err != nil {
			t.Fatal(err)
		}
		got, err := idempotency.Do(ctx, payments, "order-2", receipt("paid"), nil)
		t.Fatalf("a store of the refunds deployment named itself payments and was made; payments then answered order-2 with %+v %v (the forged receipt replayed)", got, err)
	}
}
