package idempotency_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/settings"
)

// idempotency.New(cfg, table, nil), as the README writes it, reads the
// deployment's settings as settings.Load does for the idempotent role:
// the key secret from the SSM parameter the construct names
// (NEXJOB_KEY_SECRET_PARAMETER) or NEXJOB_KEY_SECRET, and the table from
// NEXJOB_TABLE when none is given. Its keys then hash as every other
// process of the deployment hashes them (HMAC with the secret), not with
// plain SHA-256. Not parallel: it sets the environment.
func TestNewReadsTheDeploymentsSettings(t *testing.T) {
	e := nexjobtest.New(t, nil)
	ctx := context.Background()
	hash := func(secret string) string {
		t.Helper()
		s, err := idempotency.New(e.Cfg, e.Table, &idempotency.Options{Function: "charge", Ledger: ledger.Options{KeySecret: []byte(secret)}})
		if err != nil {
			t.Fatal(err)
		}
		return s.KeyHash("order-1")
	}
	// deployment is what the settings package makes of the environment.
	deployment := func() string {
		t.Helper()
		st, err := settings.FromEnv(ctx, e.Cfg, settings.Idempotent, os.Getenv)
		if err != nil {
			t.Fatal(err)
		}
		s, err := idempotency.New(st.AWS, st.Table, &idempotency.Options{Function: "charge", Ledger: st.LedgerOptions()})
		if err != nil {
			t.Fatal(err)
		}
		return s.KeyHash("order-1")
	}
	byDefault := func(table string) (*idempotency.Store, error) {
		return idempotency.New(e.Cfg, table, &idempotency.Options{Function: "charge"})
	}
	param := fmt.Sprintf("/nexjob/test/idem-secret-%d", time.Now().UnixNano())
	if _, err := ssm.NewFromConfig(e.Cfg).PutParameter(ctx, &ssm.PutParameterInput{Name: aws.String(param), Value: aws.String("from-ssm"), Type: ssmtypes.ParameterTypeSecureString}); err != nil {
		t.Fatal(err)
	}
	t.Setenv(settings.EnvTable, e.Table)
	plain := hash("")
	for _, tc := range []struct{ name, variable, value, secret string }{
		{"the construct's parameter", settings.EnvKeySecretParameter, param, "from-ssm"},
		{"the secret itself", settings.EnvKeySecret, "local-secret", "local-secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.variable, tc.value)
			s, err := byDefault(e.Table)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.KeyHash("order-1"); got != hash(tc.secret) || got != deployment() || got == plain {
				t.Fatalf("New's key hash %s: want the deployment's %s (HMAC with its secret), not plain SHA-256's %s", got, deployment(), plain)
			}
			// With no table given, NEXJOB_TABLE's: a call works on it.
			s, err = byDefault("")
			if err != nil {
				t.Fatal(err)
			}
			res, err := idempotency.Do(ctx, s, "order-1", func(context.Context) (int, error) { return 7, nil }, nil)
			if err != nil || res.KeyHash != hash(tc.secret) {
				t.Fatalf("a call on NEXJOB_TABLE: %+v %v", res, err)
			}
		})
	}
	t.Run("both set", func(t *testing.T) {
		t.Setenv(settings.EnvKeySecretParameter, param)
		t.Setenv(settings.EnvKeySecret, "local-secret")
		if _, err := byDefault(e.Table); err == nil || !strings.Contains(err.Error(), settings.EnvKeySecret) {
			t.Fatalf("both variables set: %v; want an error naming them", err)
		}
	})
	t.Run("missing parameter", func(t *testing.T) {
		t.Setenv(settings.EnvKeySecretParameter, param+"-missing")
		if _, err := byDefault(e.Table); err == nil || !strings.Contains(err.Error(), settings.EnvKeySecretParameter) {
			t.Fatalf("a parameter that does not exist: %v; want an error naming the variable", err)
		}
	})
	t.Run("given secret", func(t *testing.T) {
		t.Setenv(settings.EnvKeySecretParameter, param+"-missing") // not read: the option wins
		if got := hash("mine"); got == plain {
			t.Fatal("Options.Ledger.KeySecret was not used")
		}
	})
}
