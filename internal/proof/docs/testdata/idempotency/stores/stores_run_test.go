// stores/stores_run_test.go: written beside docs/idempotency.md's own
// stores/stores.go by TestIdempotencyBlocksRun (internal/proof/docs):
// each store runs a call and replays its repeat.
package stores

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/redis/go-redis/v9"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

func onceThenReplay(t *testing.T, s *idempotency.Store) {
	t.Helper()
	runs := 0
	do := func(context.Context) (string, error) { runs++; return fmt.Sprintf("re_%d", runs), nil }
	first, err := idempotency.Do(context.Background(), s, "refund-1", do, nil)
	if err != nil || first.Replayed {
		t.Fatalf("the first call: %+v %v", first, err)
	}
	again, err := idempotency.Do(context.Background(), s, "refund-1", do, nil)
	if err != nil || !again.Replayed || again.Value != "re_1" || runs != 1 {
		t.Fatalf("its repeat: %+v %v, %d runs; want re_1 replayed, 1 run", again, err, runs)
	}
}

// SharedWithPowertools on a Powertools table (partition key "id") on the
// emulator.
func TestSharedWithPowertoolsRunsOnceThenReplays(t *testing.T) {
	e := nexjobtest.New(t, nil)
	db := dynamodb.NewFromConfig(e.Cfg)
	table := e.Table + "-powertools"
	_, err := db.CreateTable(context.Background(), &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	var riu *types.ResourceInUseException
	if err != nil && !errors.As(err, &riu) { // in use: the SDK's resend of our own create
		t.Fatal(err)
	}
	s, err := SharedWithPowertools(e.Cfg, table)
	if err != nil {
		t.Fatal(err)
	}
	onceThenReplay(t, s)
}

// OnTheNexjobTable on the kit's nexjob table.
func TestOnTheNexjobTableRunsOnceThenReplays(t *testing.T) {
	e := nexjobtest.New(t, nil)
	s, err := OnTheNexjobTable(e.Cfg, e.Table)
	if err != nil {
		t.Fatal(err)
	}
	onceThenReplay(t, s)
}

func TestInMemoryRunsOnceThenReplays(t *testing.T) {
	s, err := InMemory()
	if err != nil {
		t.Fatal(err)
	}
	onceThenReplay(t, s)
}

// OnRedis against a redis-server started here on a free loopback port
// (make redis installs it); without one, skipped, except under CI=true.
func TestOnRedisRunsOnceThenReplays(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no redis-server under CI (make redis installs it)")
		}
		t.Skip("no redis-server (make redis installs it)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	srv := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for i := 0; c.Ping(context.Background()).Err() != nil; i++ {
		if i == 200 {
			t.Fatal("redis-server did not answer")
		}
		time.Sleep(25 * time.Millisecond) // until its first PONG
	}
	s, err := OnRedis(aws.Config{}, addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	onceThenReplay(t, s)
}
