package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/redis/go-redis/v9"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/idempotency/idemtest"
	"github.com/nexjob/nexjob-aws/idempotency/redisstore"
	"github.com/nexjob/nexjob-aws/ledger"
)

// addr is the Redis server the tests run against: REDIS_ADDR when set,
// else one redis-server (or valkey-server) started here on a free
// loopback port and stopped after. With neither, the tests are skipped
// with a message, except under CI=true, where they fail (make test
// installs Debian's redis-server: make redis).
var addr, why string

func TestMain(m *testing.M) {
	stop := start()
	code := m.Run()
	stop()
	os.Exit(code)
}

func start() func() {
	if addr = os.Getenv("REDIS_ADDR"); addr != "" {
		return func() {}
	}
	bin := ""
	for _, name := range []string{"redis-server", "valkey-server"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		why = "no redis-server or valkey-server on PATH (make redis installs Debian's), and no REDIS_ADDR"
		return func() {}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		why = err.Error()
		return func() {}
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir, err := os.MkdirTemp("", "redisstore")
	if err != nil {
		why = err.Error()
		return func() {}
	}
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "yes")
	log, _ := os.Create(filepath.Join(dir, "server.log"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		why = err.Error()
		return func() {}
	}
	a := fmt.Sprintf("127.0.0.1:%d", port)
	c := redis.NewClient(&redis.Options{Addr: a})
	defer func() { _ = c.Close() }()
	for i := 0; ; i++ {
		if c.Ping(context.Background()).Err() == nil {
			addr = a
			break
		}
		if i == 200 {
			b, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			why = "redis-server did not answer: " + string(b)
			break
		}
		time.Sleep(25 * time.Millisecond) // waiting for the server's first PONG
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.RemoveAll(dir)
	}
}

// client is a client of the test server, its commands through hooks.
func client(t *testing.T, hooks ...redis.Hook) *redis.Client {
	t.Helper()
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Redis server under CI: %s", why)
		}
		t.Skipf("no Redis server: %s", why)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	for _, h := range hooks {
		c.AddHook(h)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The behaviour suite every Backend passes, on a real Redis server.
func TestBackendRedis(t *testing.T) {
	t.Parallel()
	c := client(t)
	idemtest.Run(t, func(_ *testing.T, now func() time.Time) idempotency.Backend {
		return redisstore.New(c, &redisstore.Options{Now: now})
	})
}

// faults is a hook that counts commands and, for the commands a rule
// names, forwards then answers an error (applied, its reply lost) or
// answers an error without forwarding.
type faults struct {
	mu    sync.Mutex
	calls []string
	lose  map[string]int // command name (evalsha's script by its first key's use: "begin", "record", "release") → replies to lose
	fail  map[string]int // → calls to refuse unsent
	reads int            // HGETALLs to fail after a lost reply
}

func (f *faults) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *faults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// name is what a command does: a script by its shape, else its name.
func name(cmd redis.Cmder) string {
	n := cmd.Name()
	if n != "evalsha" && n != "eval" {
		return n
	}
	switch len(cmd.Args()) {
	case 3 + 1 + 10:
		return "begin"
	case 3 + 1 + 7:
		return "record"
	default:
		return "release"
	}
}

func (f *faults) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		n := name(cmd)
		if n == "hello" || n == "client" || n == "ping" {
			return next(ctx, cmd) // a connection's setup, after a lost reply closed the last
		}
		f.mu.Lock()
		f.calls = append(f.calls, n)
		fail, read := f.fail[n] > 0, n == "hgetall" && f.reads > 0
		switch {
		case fail:
			f.fail[n]--
		case read:
			f.reads--
		}
		f.mu.Unlock()
		if fail || read {
			err := errors.New("injected: connection refused")
			cmd.SetErr(err)
			return err
		}
		err := next(ctx, cmd)
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			return err // not applied: go-redis loads the script and sends it again
		}
		f.mu.Lock()
		lose := f.lose[n] > 0
		if lose {
			f.lose[n]--
		}
		f.mu.Unlock()
		if lose {
			err = errors.New("injected: i/o timeout, reply lost")
			cmd.SetErr(err)
		}
		return err
	}
}

func (f *faults) ops() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.calls, " ")
}

func (f *faults) reset() {
	f.mu.Lock()
	f.calls = nil
	f.mu.Unlock()
}

func store(t *testing.T, c *redis.Client, o *idempotency.Options) *idempotency.Store {
	t.Helper()
	var opts idempotency.Options
	if o != nil {
		opts = *o
	}
	opts.Backend = redisstore.New(c, nil)
	opts.Function = "charge-" + ledger.NewNonce()[:8]
	opts.Ledger.KeySecret = []byte("test")
	opts.Logger = slog.New(slog.DiscardHandler)
	s, err := idempotency.New(aws.Config{}, "", &opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Commands pinned: a first call is two scripts (hold, record), a repeat
// one; a failed call a hold and a release. (The scripts are loaded once
// per server: the first EVALSHA of each answers NOSCRIPT and go-redis
// sends EVAL, so the pins are taken once the scripts are loaded.)
func TestRedisCommands(t *testing.T) {
	t.Parallel()
	f := &faults{}
	c := client(t, f)
	s := store(t, c, nil)
	var ch idemtest.Charger
	ctx := context.Background()
	if _, err := idempotency.Do(ctx, s, "warm", ch.Charge(1), nil); err != nil {
		t.Fatal(err)
	}
	bad := idemtest.Charger{Err: errors.New("declined")}
	_, _ = idempotency.Do(ctx, s, "warm-bad", bad.Charge(1), nil)
	for _, tc := range []struct {
		key  string
		c    *idemtest.Charger
		want string
	}{
		{"order-1", &ch, "begin record"},
		{"order-1", &ch, "begin"},
		{"order-2", &bad, "begin release"},
	} {
		f.reset()
		_, _ = idempotency.Do(ctx, s, tc.key, tc.c.Charge(1), nil)
		if got := f.ops(); got != tc.want {
			t.Errorf("%s: commands %q, want %q", tc.key, got, tc.want)
		}
	}
}

// Every write applied with its reply lost is read back and taken for the
// success it is: the function runs once, its result is recorded, a
// released key is free.
func TestRedisLostReplies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, op := range []string{"begin", "record"} {
		f := &faults{lose: map[string]int{op: 1}}
		s := store(t, client(t, f), nil)
		var ch idemtest.Charger
		res, err := idempotency.Do(ctx, s, "order-lost", ch.Charge(1), nil)
		if err != nil || res.Replayed || ch.Runs.Load() != 1 {
			t.Fatalf("%s's reply lost: %+v %v, %d runs; want run once and recorded", op, res, err, ch.Runs.Load())
		}
		again, err := idempotency.Do(ctx, s, "order-lost", ch.Charge(1), nil)
		if err != nil || !again.Replayed || again.Value != res.Value {
			t.Fatalf("%s's reply lost, a repeat: %+v %v; want %+v replayed", op, again, err, res.Value)
		}
		if !strings.Contains(f.ops(), op+" hgetall") {
			t.Errorf("%s's reply lost: commands %q, want a read after it", op, f.ops())
		}
	}
	f := &faults{lose: map[string]int{"release": 1}}
	s := store(t, client(t, f), nil)
	bad := idemtest.Charger{Err: errors.New("declined")}
	if _, err := idempotency.Do(ctx, s, "order-rel", bad.Charge(1), nil); err == nil || err.Error() != "declined" {
		t.Fatalf("release's reply lost: %v, want the function's error alone", err)
	}
	bad.Err = nil
	if res, err := idempotency.Do(ctx, s, "order-rel", bad.Charge(1), nil); err != nil || res.Replayed || bad.Runs.Load() != 2 {
		t.Fatalf("after a lost release reply: %+v %v, %d runs; want the key free", res, err, bad.Runs.Load())
	}
}

// A hold refused unsent, or sent with both its reply and the read after
// it lost: the function does not run and the caller gets the error.
func TestRedisFailuresRunNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, f := range []*faults{{fail: map[string]int{"begin": 1}, reads: 1}, {lose: map[string]int{"begin": 1}, reads: 1}} {
		s := store(t, client(t, f), nil)
		var ch idemtest.Charger
		_, err := idempotency.Do(ctx, s, "order-x", ch.Charge(1), nil)
		var uo *ledger.UnknownOutcomeError
		if !errors.As(err, &uo) || ch.Runs.Load() != 0 || strings.Contains(err.Error(), "order-x") {
			t.Fatalf("%+v: %v, %d runs; want an *UnknownOutcomeError naming no key, nothing run", f, err, ch.Runs.Load())
		}
	}
	// A record whose reply and read-back are lost: the result is the
	// function's, reported not recorded.
	f := &faults{lose: map[string]int{"record": 1}, reads: 1}
	s := store(t, client(t, f), nil)
	var ch idemtest.Charger
	res, err := idempotency.Do(ctx, s, "order-y", ch.Charge(1), nil)
	if !errors.Is(err, idempotency.ErrNotRecorded) || res.Value.ChargeID != "ch_1" {
		t.Fatalf("record's reply and read lost: %+v %v; want the value with *NotRecordedError", res, err)
	}
}

// Records live under the prefix, their Redis key the key's hash (never
// the key), with the server's expiry at the retention's end.
func TestRedisRecordLayout(t *testing.T) {
	t.Parallel()
	c := client(t)
	s := store(t, c, &idempotency.Options{Retention: time.Hour})
	var ch idemtest.Charger
	res, err := idempotency.Do(context.Background(), s, "order \"secret\" 42", ch.Charge(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	key := redisstore.DefaultPrefix + res.KeyHash
	ttl, err := c.PTTL(context.Background(), key).Result()
	if err != nil || ttl <= 59*time.Minute || ttl > time.Hour+time.Second {
		t.Fatalf("the record's expiry: %s %v; want about an hour", ttl, err)
	}
	f, err := c.HGetAll(context.Background(), key).Result()
	if err != nil || f["state"] != "Succeeded" || f["result"] != `{"ChargeID":"ch_1","Amount":1}` {
		t.Fatalf("the record: %v %v", f, err)
	}
	keys, err := c.Keys(context.Background(), "*secret*").Result()
	if err != nil || len(keys) != 0 {
		t.Fatalf("a Redis key holds the raw key: %v %v", keys, err)
	}
}

// dropper is a connection that, once armed with a marker, forwards the
// next write holding it and then drops the connection before its reply:
// the write applied, its reply lost, and go-redis sends it again on a new
// connection (its own retry), as a network failure does.
type dropper struct {
	net.Conn
	marker *atomic.Value // string: drop the reply to the next EVALSHA holding it
	drop   bool
}

func (d *dropper) Write(b []byte) (int, error) {
	if m, _ := d.marker.Load().(string); m != "" && strings.Contains(strings.ToLower(string(b)), "evalsha") && strings.Contains(string(b), m) {
		d.marker.Store("")
		d.drop = true
	}
	return d.Conn.Write(b)
}

func (d *dropper) Read(b []byte) (int, error) {
	if d.drop {
		// Wait for the server to have applied it: its reply arrives.
		if _, err := d.Conn.Read(make([]byte, 1)); err != nil {
			return 0, err
		}
		_ = d.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return d.Conn.Read(b)
}

// go-redis's own resend of a script whose reply was lost meets its own
// token and reads as done: a hold resent is the caller's, an outcome
// resent is recorded once.
func TestRedisResends(t *testing.T) {
	t.Parallel()
	if addr == "" {
		client(t) // skips or fails with the reason
	}
	for _, marker := range []string{"RejectAlways", "Succeeded"} {
		m := &atomic.Value{}
		m.Store("")
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 3, Dialer: func(ctx context.Context, network, a string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, a)
			if err != nil {
				return nil, err
			}
			return &dropper{Conn: conn, marker: m}, nil
		}})
		t.Cleanup(func() { _ = c.Close() })
		s := store(t, c, nil)
		var ch idemtest.Charger
		if _, err := idempotency.Do(context.Background(), s, "warm", ch.Charge(1), nil); err != nil { // the scripts loaded
			t.Fatal(err)
		}
		m.Store(marker)
		res, err := idempotency.Do(context.Background(), s, "order-resent", ch.Charge(1), nil)
		if err != nil || res.Replayed || ch.Runs.Load() != 2 || m.Load().(string) != "" {
			t.Fatalf("%s resent: %+v %v, %d runs, armed %q; want run once, recorded, the reply dropped", marker, res, err, ch.Runs.Load(), m.Load())
		}
		again, err := idempotency.Do(context.Background(), s, "order-resent", ch.Charge(1), nil)
		if err != nil || !again.Replayed || again.Value != res.Value {
			t.Fatalf("%s resent, a repeat: %+v %v; want %+v replayed", marker, again, err, res.Value)
		}
		// The Backend's own answer (the Store forgives a taken-over
		// record within its hold): the resend is done, not taken over.
		b := redisstore.New(c, nil)
		kh := ledger.CallKey("resend", ledger.NewNonce())
		held, began, err := b.BeginCall(context.Background(), kh, "", ledger.RejectAlways, time.Now().Add(time.Minute), time.Second, time.Hour)
		if err != nil || !began {
			t.Fatal(began, err)
		}
		m.Store(marker)
		done, err := b.RecordCall(context.Background(), held, ledger.Succeeded, []byte("1"), "", time.Now().Add(time.Hour))
		if marker == "Succeeded" && (err != nil || done.State != ledger.Succeeded || m.Load().(string) != "") {
			t.Fatalf("a record resent: %+v %v; want done", done, err)
		}
		m.Store("")
	}
}
