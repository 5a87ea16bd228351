package ssmparam_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/aws/smithy-go"

	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/internal/ssmparam"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

// put stores a SecureString parameter with the SDK's own SSM client.
func put(t *testing.T, cfg aws.Config, value string) string {
	t.Helper()
	name := "/nexjob/ssmparam/" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + time.Now().Format("150405.000000")
	if _, err := ssm.NewFromConfig(cfg).PutParameter(context.Background(), &ssm.PutParameterInput{
		Name: aws.String(name), Value: aws.String(value), Type: ssmtypes.ParameterTypeSecureString,
	}); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestGet reads a SecureString back, decrypted; a missing one is SSM's
// ParameterNotFound as an APIError that smithy.APIError matches, with no
// value in the text.
func TestGet(t *testing.T) {
	t.Parallel()
	cfg := nexjobtest.Config(t)
	name := put(t, cfg, "s3cr3t-value")
	v, err := ssmparam.Get(context.Background(), cfg, name)
	if err != nil || v != "s3cr3t-value" {
		t.Fatalf("Get: %q %v", v, err)
	}
	_, err = ssmparam.Get(context.Background(), cfg, name+"-missing")
	var api smithy.APIError
	if !errors.As(err, &api) || api.ErrorCode() != "ParameterNotFound" || api.ErrorFault() != smithy.FaultClient {
		t.Fatalf("a missing parameter: %v; want ParameterNotFound", err)
	}
}

// TestGetUnderFaults: throttles and lost replies (the read applied, its
// reply a 500) are retried by the config's retryer; a throttle that
// outlasts its attempts is the error, coded as SSM codes it.
func TestGetUnderFaults(t *testing.T) {
	t.Parallel()
	base := nexjobtest.Config(t)
	name := put(t, base, "v-1")
	for _, tc := range []struct {
		fault faults.Fault
		times int
		ok    bool
	}{
		{faults.Throttle, faults.Attempts - 1, true},
		{faults.LostReply, faults.Attempts - 1, true},
		{faults.Timeout, 1, true},
		{faults.Throttle, faults.Attempts, false},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			ft := faults.New(nil)
			cfg := faults.Config(base, ft)
			r := ft.Add(faults.Rule{Op: "SSM.GetParameter", Fault: tc.fault, Times: tc.times})
			v, err := ssmparam.Get(context.Background(), cfg, name)
			if r.Fired() != tc.times {
				t.Fatalf("the fault fired %d times, want %d", r.Fired(), tc.times)
			}
			if tc.ok {
				if err != nil || v != "v-1" {
					t.Fatalf("after %d × %s: %q %v", tc.times, tc.fault, v, err)
				}
				return
			}
			var api *ssmparam.APIError
			if !errors.As(err, &api) || api.Code != "ThrottlingException" || api.Status != 400 {
				t.Fatalf("throttled past the retries: %v; want the ThrottlingException", err)
			}
		})
	}
}
