package provision_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/nexjob/nexjob-aws/provision"
)

// TestLocalStackTableJSON: LocalStack's init hook creates the table from
// localstack/ready.d/table.json; it must be the ledger's schema. Regenerate
// with `go run ./cmd/nexjob schema > localstack/ready.d/table.json`.
func TestLocalStackTableJSON(t *testing.T) {
	want, err := provision.TableJSON("nexjob")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../localstack/ready.d/table.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(want)) {
		t.Fatalf("localstack/ready.d/table.json is out of date with ledger.CreateTableInput:\n%s", want)
	}
}

// TestLocalStackStepsTableJSON: the same for the steps table. Regenerate
// with `go run ./cmd/nexjob schema steps > localstack/ready.d/steps-table.json`.
func TestLocalStackStepsTableJSON(t *testing.T) {
	want, err := provision.StepsTableJSON("nexjob-steps")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../localstack/ready.d/steps-table.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(want)) {
		t.Fatalf("localstack/ready.d/steps-table.json is out of date with ledger.CreateStepsTableInput:\n%s", want)
	}
}
