package faults_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/provision"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

// S3 requests through the transport, against the emulator's S3: named
// by operation, and failed as S3 fails them. A lost reply is applied and
// answered 500 InternalError, and the SDK's resend of the put succeeds;
// a throttle is 503 SlowDown, which the SDK's retryer takes as a
// throttle: once, it is retried away; past its attempts, the caller gets
// SlowDown and nothing was written.
func TestS3RequestsAreNamedAndFailAsS3(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, &nexjobtest.Options{BlobBucket: true})
	ft := faults.New(nil)
	c := provision.S3(faults.Config(e.Cfg, ft))
	ctx := context.Background()
	put := func(key string) error {
		_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(e.BlobBucket), Key: aws.String(key), Body: bytes.NewReader([]byte("v-" + key))})
		return err
	}
	get := func(key string) (string, error) {
		out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(e.BlobBucket), Key: aws.String(key)})
		if err != nil {
			return "", err
		}
		defer func() { _ = out.Body.Close() }()
		b, err := io.ReadAll(out.Body)
		return string(b), err
	}

	lost := ft.Add(faults.Rule{Op: "S3.PutObject", Fault: faults.LostReply})
	if err := put("lost"); err != nil || lost.Fired() != 1 {
		t.Fatalf("a put whose first reply was lost: %v (the fault fired %d times)", err, lost.Fired())
	}
	once := ft.Add(faults.Rule{Op: "S3.GetObject", Fault: faults.Throttle})
	if v, err := get("lost"); err != nil || v != "v-lost" || once.Fired() != 1 {
		t.Fatalf("a get throttled once: %q %v (fired %d); want the object, the throttle retried away", v, err, once.Fired())
	}
	past := ft.Add(faults.Rule{Op: "S3.PutObject", Fault: faults.Throttle, Times: faults.Attempts})
	err := put("throttled")
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "SlowDown" || !(retry.ThrottleErrorCode{Codes: retry.DefaultThrottleErrorCodes}).IsErrorThrottle(err).Bool() || past.Fired() != faults.Attempts {
		t.Fatalf("a put throttled past the retries: %v (fired %d); want SlowDown, a throttle, after %d attempts", err, past.Fired(), faults.Attempts)
	}
	if _, err := get("throttled"); err == nil {
		t.Fatal("the throttled put's object exists: a throttle is not forwarded")
	}
	var names []string
	for _, op := range ft.Ops() {
		if strings.HasPrefix(op, "S3.") {
			names = append(names, op)
		}
	}
	want := "S3.PutObject S3.PutObject S3.GetObject S3.GetObject S3.PutObject S3.PutObject S3.PutObject S3.PutObject S3.GetObject"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("the requests as named: %s\nwant %s", got, want)
	}
}
