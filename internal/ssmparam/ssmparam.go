// Package ssmparam reads one SSM parameter, decrypted: the key secret
// every role but the guard reads once at start. It makes the one request
// (AmazonSSM.GetParameter, the JSON 1.1 protocol) with the SDK's own
// pieces: the config's credentials, HTTP client and retryer, and its
// SigV4 signer. The SSM client package is not linked: its schema
// registry made 0.9 MB of every function's binary and 1.7 ms and 1.4 MB
// of allocations at every cold start (GODEBUG=inittrace=1 on the worker),
// for a call made once.
//
// # How it fails
//
// A refusal SSM answered (ParameterNotFound, AccessDeniedException, a
// KMS error) is an *APIError with its code, message and HTTP status; it
// implements smithy.APIError, so errors.As with that interface works as
// for an SDK client's error. Throttles, 5xx replies and connection errors
// are retried as the config's retryer decides (its attempts and backoff);
// the last error is returned. The parameter's value never appears in an
// error.
//
// The endpoint is AWS_ENDPOINT_URL_SSM, else the config's BaseEndpoint
// (AWS_ENDPOINT_URL: an emulator, LocalStack), else the region's public
// one (ssm.<region>.amazonaws.com, .amazonaws.com.cn in China). FIPS and
// dual-stack endpoints are not chosen by the AWS_USE_* settings: name
// one in AWS_ENDPOINT_URL_SSM.
package ssmparam

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/smithy-go"
)

// APIError is a refusal SSM answered.
type APIError struct {
	Code, Message string
	Status        int
}

func (e *APIError) Error() string {
	return fmt.Sprintf("ssm GetParameter: %s (HTTP %d): %s", e.Code, e.Status, e.Message)
}

// ErrorCode, ErrorMessage and ErrorFault implement smithy.APIError.
func (e *APIError) ErrorCode() string    { return e.Code }
func (e *APIError) ErrorMessage() string { return e.Message }
func (e *APIError) ErrorFault() smithy.ErrorFault {
	if e.Status >= 500 {
		return smithy.FaultServer
	}
	return smithy.FaultClient
}

// HTTPStatusCode lets the SDK's retryer classify the error.
func (e *APIError) HTTPStatusCode() int { return e.Status }

// Get returns the decrypted value of the parameter name.
func Get(ctx context.Context, cfg aws.Config, name string) (string, error) {
	if cfg.Region == "" {
		return "", errors.New("ssm GetParameter: no region")
	}
	if cfg.Credentials == nil {
		return "", errors.New("ssm GetParameter: no credentials")
	}
	body, err := json.Marshal(struct {
		Name           string
		WithDecryption bool
	}{name, true})
	if err != nil {
		return "", err
	}
	client := cfg.HTTPClient
	if client == nil {
		client = http.DefaultClient
	}
	var r aws.Retryer
	if cfg.Retryer != nil {
		r = cfg.Retryer()
	}
	attempts := 1
	if r != nil {
		attempts = r.MaxAttempts()
	}
	for attempt := 1; ; attempt++ {
		v, err := once(ctx, cfg, client, endpoint(cfg), body)
		if err == nil || attempt >= attempts || r == nil || !r.IsErrorRetryable(err) {
			return v, err
		}
		d, derr := r.RetryDelay(attempt, err)
		if derr != nil {
			return "", err
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", fmt.Errorf("%w (after: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

func endpoint(cfg aws.Config) string {
	if v := os.Getenv("AWS_ENDPOINT_URL_SSM"); v != "" {
		return v
	}
	if cfg.BaseEndpoint != nil && *cfg.BaseEndpoint != "" {
		return *cfg.BaseEndpoint
	}
	domain := "amazonaws.com"
	if strings.HasPrefix(cfg.Region, "cn-") {
		domain = "amazonaws.com.cn"
	}
	return "https://ssm." + cfg.Region + "." + domain
}

func once(ctx context.Context, cfg aws.Config, client aws.HTTPClient, url string, body []byte) (string, error) {
	creds, err := cfg.Credentials.Retrieve(ctx)
	if err != nil {
		return "", fmt.Errorf("ssm GetParameter: credentials: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(url, "/")+"/", bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("ssm GetParameter: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-amz-json-1.1")
	req.Header.Set("X-Amz-Target", "AmazonSSM.GetParameter")
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), "ssm", cfg.Region, time.Now()); err != nil {
		return "", fmt.Errorf("ssm GetParameter: sign: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("ssm GetParameter: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("ssm GetParameter: read the reply: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Type    string `json:"__type"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(raw, &e)
		code := e.Type
		if i := strings.LastIndexByte(code, '#'); i >= 0 {
			code = code[i+1:]
		}
		if code == "" {
			code = http.StatusText(resp.StatusCode)
		}
		return "", &APIError{Code: code, Message: e.Message, Status: resp.StatusCode}
	}
	var out struct {
		Parameter *struct{ Value *string }
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Parameter == nil || out.Parameter.Value == nil {
		return "", errors.New("ssm GetParameter: a reply with no parameter value")
	}
	return *out.Parameter.Value, nil
}
