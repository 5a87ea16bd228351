package handler_test

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

type atkBank struct {
	N int `json:"n"`
}

func (atkBank) Kind() string { return "atk.bank" }

// tokenEnv runs atk.bank jobs: a callback token for "bank", then a wait
// for it (an hour).
func tokenEnv(t *testing.T) (*nexjobtest.Env, *handler.Handler, chan string, *sync.Map) {
	t.Helper()
	e := nexjobtest.New(t, &nexjobtest.Options{Ledger: ledger.Options{KeySecret: []byte("a deployment's secret")}})
	tokens := make(chan string, 4)
	var got sync.Map
	reg := handler.NewRegistry()
	handler.AddWorker(reg, handler.WorkFunc[atkBank](func(ctx context.Context, j *handler.Job[atkBank]) error {
		tok, err := handler.CallbackToken(ctx, "bank")
		if err != nil {
			return err
		}
		select {
		case tokens <- tok:
		default:
		}
		a, err := handler.WaitForSignal[approval](ctx, "bank", time.Hour)
		if err != nil {
			return err
		}
		got.Store(j.ID, a.By)
		return nil
	}), nil)
	return e, e.Handler(t, reg, &handler.Options{Logger: quiet}), tokens, &got
}

// README, Callback tokens: "a token is never guessable from a job's id,
// and a forged or altered one is ledger.ErrBadCallbackToken".
// handler.CallbackToken: "a MAC under the deployment's key secret binds
// the job and the name, so no token is guessable from a job id".
//
// The token's MAC is the same function, under the same secret, as the
// stored hash of an idempotency key: HMAC-SHA256(secret, key) cut to 128
// bits, base32. A key "callback\x00<job id>\x00<name>" is a valid key
// (keys may hold NUL), so whoever can enqueue with a key of their choice
// and read a job's key hash (the dashboard's job page and `nexjob show`
// print it, read-only included; Store().Get returns it) mints the token
// of any job's wait from its id alone, with no secret.
func TestAttackCallbackTokenForgedFromAKeyHash(t *testing.T) {
	t.Parallel()
	e, h, _, got := tokenEnv(t)
	ctx := context.Background()
	victim, err := e.Client.Enqueue(ctx, atkBank{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h) // the victim waits for "bank"
	e.RequireState(t, victim.ID, ledger.Scheduled)
	// The attacker: an enqueue with a chosen key, and its key hash read
	// back as the dashboard shows it.
	oracle, err := e.Client.Enqueue(ctx, atkBank{N: 2}, &enqueue.Opts{IdempotencyKey: "callback\x00" + victim.ID + "\x00bank", Delay: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	mac := e.Get(t, oracle.ID).KeyHash
	forged := "njcb2." + base64.RawURLEncoding.EncodeToString([]byte(victim.ID+"\x00bank\x00AAAAAAAAAAAAAAAAAAAA")) + "." + mac
	err = e.Client.Complete(ctx, forged, approval{By: "mallory"})
	e.Drain(t, h)
	by, _ := got.Load(victim.ID)
	if !errors.Is(err, ledger.ErrBadCallbackToken) {
		t.Fatalf("a token made without the secret, from the job's id and a key hash: Complete: %v (want ErrBadCallbackToken); the job %s, its wait completed by %v",
			err, e.Get(t, victim.ID).State, by)
	}
}

// README, Callback tokens: "a forged or altered one is
// ledger.ErrBadCallbackToken". The token's body is unpadded base64url,
// decoded leniently (encoding/base64 without Strict): the last
// character's unused low bits may be changed and the body decodes to the
// same job and name, so an altered token is accepted.
func TestAttackCallbackTokenAltered(t *testing.T) {
	t.Parallel()
	e, h, tokens, got := tokenEnv(t)
	ctx := context.Background()
	job, err := e.Client.Enqueue(ctx, atkBank{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Drain(t, h)
	tok := <-tokens
	dot := strings.LastIndexByte(tok, '.')
	body, mac := tok[len("njcb2."):dot], tok[dot:]
	raw, _ := base64.RawURLEncoding.DecodeString(body)
	if len(raw)%3 == 0 {
		t.Skipf("the body (%d bytes) has no unused bits", len(raw))
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, body[len(body)-1])
	altered := "njcb2." + body[:len(body)-1] + string(alphabet[last^1]) + mac // flip the lowest (unused) bit
	if altered == tok {
		t.Fatal("not altered")
	}
	err = e.Client.Complete(ctx, altered, approval{By: "altered"})
	e.Drain(t, h)
	by, _ := got.Load(job.ID)
	if !errors.Is(err, ledger.ErrBadCallbackToken) {
		t.Fatalf("an altered token (%q, made %q): Complete: %v (want ErrBadCallbackToken); the wait completed by %v", altered, tok, err, by)
	}
}
