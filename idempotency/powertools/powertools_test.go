package powertools_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/idempotency/idemtest"
	"github.com/nexjob/nexjob-aws/idempotency/powertools"
	"github.com/nexjob/nexjob-aws/internal/proof/awstest"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }

// The Powertools sides are the libraries themselves, installed once into
// the repository's .cache/powertools: Python's from PyPI
// (testdata/requirements.txt, pinned), TypeScript's from npm
// (testdata/ts/package-lock.json, npm ci). With no python3 or npm, or no
// registry, the tests that need them skip, except under CI=true, where
// they fail.
var peers struct {
	once       sync.Once
	python, ts string // the interpreter and script, "" when not installed
	pyErr      error
	tsErr      error
}

func cacheDir() string {
	abs, _ := filepath.Abs(filepath.Join("..", "..", ".cache", "powertools"))
	return abs
}

func install() {
	dir := cacheDir()
	py := filepath.Join(dir, "py")
	if _, err := os.Stat(filepath.Join(py, "installed")); err != nil {
		peers.pyErr = run(dir, "python3", "-m", "venv", py)
		if peers.pyErr == nil {
			peers.pyErr = run(dir, filepath.Join(py, "bin", "pip"), "install", "-q", "--disable-pip-version-check", "-r", abs("testdata/requirements.txt"))
		}
		if peers.pyErr == nil {
			peers.pyErr = os.WriteFile(filepath.Join(py, "installed"), nil, 0o600)
		}
	}
	if peers.pyErr == nil {
		peers.python = filepath.Join(py, "bin", "python")
	}
	ts := filepath.Join(dir, "ts")
	if _, err := os.Stat(filepath.Join(ts, "installed")); err != nil {
		for _, f := range []string{"package.json", "package-lock.json"} {
			if err := place(ts, f); err != nil {
				peers.tsErr = err
			}
		}
		if peers.tsErr == nil {
			peers.tsErr = run(ts, "npm", "ci", "--no-audit", "--no-fund", "--legacy-peer-deps", "-q")
		}
		if peers.tsErr == nil {
			peers.tsErr = os.WriteFile(filepath.Join(ts, "installed"), nil, 0o600)
		}
	}
	// The scripts as this checkout has them, beside the packages they
	// import (Node resolves an import from the script's folder).
	for _, f := range []string{"peer.mjs", "attack_peer.mjs"} {
		if err := place(ts, f); err != nil && peers.tsErr == nil {
			peers.tsErr = err
		}
	}
	if peers.tsErr == nil {
		peers.ts = ts
	}
}

// place copies testdata/ts/name into dir unless it is there already as
// it is, through a rename: a script another test process runs meanwhile
// is read whole, old or new (a copy in place, truncated then written,
// was read empty by a concurrent node, which printed nothing).
func place(dir, name string) error {
	b, err := os.ReadFile(abs("testdata/ts/" + name))
	if err != nil {
		return err
	}
	dst := filepath.Join(dir, name)
	if cur, err := os.ReadFile(dst); err == nil && bytes.Equal(cur, b) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, name+".*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

func abs(rel string) string {
	a, _ := filepath.Abs(rel)
	return a
}

func run(dir, name string, args ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// peer runs one command on a Powertools side ("py" or "ts") with
// testdata's peer.py or ts/peer.mjs.
func peer(t *testing.T, side string, cmd map[string]any) map[string]any {
	t.Helper()
	return runPeer(t, side, "peer", cmd)
}

// runPeer runs script (testdata/<script>.py, ts/<script>.mjs) on a side
// with one command and decodes its answer, numbers exact.
func runPeer(t *testing.T, side, script string, cmd map[string]any) map[string]any {
	t.Helper()
	peers.once.Do(install)
	var c *exec.Cmd
	switch {
	case side == "py" && peers.python != "":
		c = exec.Command(peers.python, abs("testdata/"+script+".py"))
	case side == "ts" && peers.ts != "":
		c = exec.Command("node", filepath.Join(peers.ts, script+".mjs"))
		c.Dir = peers.ts
	default:
		err := peers.pyErr
		if side == "ts" {
			err = peers.tsErr
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("Powertools (%s) not installed under CI: %v", side, err)
		}
		t.Skipf("Powertools (%s) not installed: %v", side, err)
	}
	in, err := json.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	c.Stdin = bytes.NewReader(in)
	c.Env = append(os.Environ(), "AWS_DEFAULT_REGION="+region(), "AWS_REGION="+region())
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		t.Fatalf("Powertools (%s) %v: %v\n%s", side, cmd["op"], err, stderr.String())
	}
	d := json.NewDecoder(bytes.NewReader(out))
	d.UseNumber()
	var got map[string]any
	if err := d.Decode(&got); err != nil {
		t.Fatalf("Powertools (%s): %v: %s\n%s", side, err, out, stderr.String())
	}
	return got
}

func region() string {
	if r := os.Getenv("AWS_REGION"); r != "" {
		return r
	}
	return "us-east-1"
}

// Values whose JSON each language writes its own way: escapes, unicode
// beyond the BMP, control characters, DEL, large integers, floats in
// and out of fixed notation, integral floats, nested objects whose keys
// differ in case or look like array indexes.
var tricky = []string{
	`"order-1"`,
	`"ünïcödé 😀 \u2028 \u007f \u0001 \"q\" \\ / <>&"`,
	`12345678901234567890`,
	`-0`,
	`[1.0, 2.5, 1e16, 1e15, 0.0001, 0.00001, 1e21, 1e-7, 123456789.125, -0.0]`,
	`{"b": 1, "a": {"z": [true, false, null], "Y": "x"}, "B": 2, "10": 1, "9": 2, "ä": 3, "\ud83d\ude00": 4, "\uff21": 5}`,
	`{"amount": 100, "card": "tok_4242", "currency": "EUR"}`,
	`{"B": 1, "b": 2, "a": 3}`,
	`{"b": 1, "B": 2, "b": 3}`,
	`{"İ": 1, "i": 2, "ß": 3, "SS": 4}`,
	`{"ΑΣ": 1, "ας": 2, "ασ": 3, "ΑΣa": 4}`,
}

// Our hashes are Powertools' own, for each value, in each dialect: the
// keys and payload hashes the installed libraries make of the same JSON
// text (its members in the order written: TypeScript's deepSort keeps
// keys equal but for case in that order).
func TestHashesArePowertools(t *testing.T) {
	t.Parallel()
	for _, side := range []struct {
		name    string
		dialect powertools.Dialect
	}{{"py", powertools.Python}, {"ts", powertools.TypeScript}} {
		got := peer(t, side.name, map[string]any{"op": "hash", "prefix": "payments", "docs": tricky})
		keys, _ := got["keys"].([]any)
		b, err := powertools.New(aws.Config{}, &powertools.Options{Table: "t", KeyPrefix: "payments", Dialect: side.dialect})
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range tricky {
			ours, err := b.CallKey([]byte(v))
			if err != nil {
				t.Fatal(err)
			}
			ph, err := b.PayloadHash([]byte(v))
			if err != nil {
				t.Fatal(err)
			}
			if i >= len(keys) || keys[i] != ours || "payments#"+ph != ours {
				t.Errorf("%s: %s: ours %s (payload %s), Powertools' %v", side.name, v, ours, ph, keys)
			}
		}
	}
}

// table makes a Powertools table (partition key "id", as Powertools'
// default) on the emulator.
func table(t *testing.T) (aws.Config, string) {
	t.Helper()
	e := nexjobtest.New(t, nil)
	name := e.Table + "-powertools" // the Env's table name is its own
	db := dynamodb.NewFromConfig(e.Cfg)
	_, err := db.CreateTable(context.Background(), &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	var riu *types.ResourceInUseException
	if err != nil && !errors.As(err, &riu) { // in use: the SDK's resend of our own create, its reply lost on a busy machine
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(name)})
	})
	return e.Cfg, name
}

func store(t *testing.T, cfg aws.Config, o *powertools.Options) *idempotency.Store {
	t.Helper()
	b, err := powertools.New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	s, err := idempotency.New(cfg, "", &idempotency.Options{Backend: b, Function: "payments", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type charge struct {
	Charge string `json:"charge"`
	Amount int    `json:"amount"`
}

// One table and one key space between a Go function and a Powertools
// one: a key Powertools ran is replayed to Go, with Powertools' result
// and without running; a key Go ran is replayed to Powertools; a key Go
// holds is in progress for Powertools; a payload Go validated is refused
// to Powertools under another amount, and the reverse.
func TestSharedWithPowertools(t *testing.T) {
	t.Parallel()
	for _, side := range []struct {
		name       string
		dialect    powertools.Dialect
		nexjobOnes bool // the nexjob table, "pk" and "expiresAt"
	}{{"py", powertools.Python, false}, {"ts", powertools.TypeScript, false}, {"py", powertools.Python, true}, {"ts", powertools.TypeScript, true}} {
		t.Run(fmt.Sprintf("%s/nexjob-table=%v", side.name, side.nexjobOnes), func(t *testing.T) {
			t.Parallel()
			cfg, tbl := table(t)
			o := powertools.Options{Table: tbl, KeyPrefix: "payments", Dialect: side.dialect}
			if side.nexjobOnes {
				e := nexjobtest.New(t, nil)
				cfg, tbl = e.Cfg, e.Table
				o.Table, o.KeyAttr, o.ExpiryAttr = e.Table, ledger.AttrPK, ledger.TTLAttribute
			}
			s := store(t, cfg, &o)
			ctx := context.Background()
			call := func(id string, amount int, result any) map[string]any {
				return peer(t, side.name, map[string]any{"op": "call", "table": tbl, "prefix": "payments", "key_path": "id", "payload_path": "amount",
					"event": map[string]any{"id": id, "amount": amount}, "result": result, "key_attr": o.KeyAttr, "expiry_attr": o.ExpiryAttr})
			}
			runs := 0
			fn := func(amount int) func(context.Context) (charge, error) {
				return func(context.Context) (charge, error) {
					runs++
					return charge{Charge: fmt.Sprintf("go_%d", runs), Amount: amount}, nil
				}
			}
			// Powertools first, Go repeats.
			if got := call("order-1", 100, map[string]any{"charge": "pt_1", "amount": 100}); got["ran"] != true {
				t.Fatalf("Powertools' first call: %v", got)
			}
			res, err := idempotency.Do(ctx, s, "order-1", fn(100), &idempotency.CallOptions{Payload: 100})
			if err != nil || !res.Replayed || res.Value.Charge != "pt_1" || runs != 0 {
				t.Fatalf("Go's repeat of Powertools' key: %+v %v, %d runs; want pt_1 replayed", res, err, runs)
			}
			if _, err := idempotency.Do(ctx, s, "order-1", fn(999), &idempotency.CallOptions{Payload: 999}); !errors.Is(err, idempotency.ErrPayloadMismatch) {
				t.Fatalf("Go's repeat with another amount: %v, want a payload mismatch", err)
			}
			// Go first, Powertools repeats.
			first, err := idempotency.Do(ctx, s, "order-2", fn(200), &idempotency.CallOptions{Payload: 200})
			if err != nil || first.Replayed || runs != 1 {
				t.Fatalf("Go's first call: %+v %v", first, err)
			}
			got := call("order-2", 200, map[string]any{"charge": "pt_2"})
			if r, _ := got["result"].(map[string]any); got["ran"] != false || r["charge"] != "go_1" || fmt.Sprint(r["amount"]) != "200" {
				t.Fatalf("Powertools' repeat of Go's key: %v; want go_1 replayed, not run", got)
			}
			if got := call("order-2", 201, nil); got["error"] != "IdempotencyValidationError" {
				t.Fatalf("Powertools' repeat with another amount: %v, want IdempotencyValidationError", got)
			}
			// Go holds a key: Powertools finds it in progress.
			release, done := make(chan struct{}), make(chan error, 1)
			started := make(chan struct{})
			go func() {
				_, err := idempotency.Do(ctx, s, "order-3", func(context.Context) (charge, error) {
					close(started)
					<-release
					return charge{Charge: "go_held"}, nil
				}, &idempotency.CallOptions{Payload: 300})
				done <- err
			}()
			<-started
			if got := call("order-3", 300, nil); got["error"] != "IdempotencyAlreadyInProgressError" {
				t.Fatalf("Powertools while Go holds the key: %v, want IdempotencyAlreadyInProgressError", got)
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := call("order-3", 300, nil); got["ran"] != false {
				t.Fatalf("Powertools after Go's held call: %v, want it replayed", got)
			}
		})
	}
}

// The layout keeps RejectAlways only, and no recorded errors: other
// options are refused when the Store is made, with a typed error.
func TestLayoutRefusesWhatPowertoolsCannotKeep(t *testing.T) {
	t.Parallel()
	b, err := powertools.New(aws.Config{}, &powertools.Options{Table: "t", KeyPrefix: "payments", DynamoDB: &dynamodb.Client{}})
	if err != nil {
		t.Fatal(err)
	}
	p := ledger.AllowAfterFailed
	for _, o := range []idempotency.Options{{Policy: &p}, {RecordErrors: true}} {
		o.Backend, o.Function = b, "payments"
		var le *idempotency.LayoutError
		if _, err := idempotency.New(aws.Config{}, "", &o); !errors.As(err, &le) {
			t.Errorf("%+v: %v, want *LayoutError", o, err)
		}
	}
	for _, o := range []*powertools.Options{nil, {Table: "t"}, {Table: "t", KeyPrefix: "a#b"}, {Table: "t", KeyPrefix: "j"}, {Table: "t", KeyPrefix: "pay", Dialect: 7}} {
		if _, err := powertools.New(aws.Config{}, o); err == nil {
			t.Errorf("%+v: accepted", o)
		}
	}
}

// The behaviour suite every Backend passes, on a Powertools table (its
// policy and RecordErrors cases as the layout allows: the suite's
// Policies test is the one that needs more).
func TestBackendPowertools(t *testing.T) {
	t.Parallel()
	cfg, tbl := table(t)
	idemtest.RunExcept(t, func(t *testing.T, now func() time.Time) idempotency.Backend {
		b, err := powertools.New(cfg, &powertools.Options{Table: tbl, KeyPrefix: "suite-" + ledger.NewNonce()[:8], Now: now})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, "Policies")
}

// 300 generated documents (a fixed seed: the same every run) hash as
// Powertools hashes them, in both dialects: keys from a pool that mixes
// case, accents, Greek, CJK, emoji, digits and index-like names; numbers
// integral, fractional, tiny, huge and beyond 2^53.
func TestGeneratedHashesArePowertools(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(20261207, 41))
	names := []string{"a", "A", "b", "B", "10", "9", "0", "01", "4294967295", "4294967294", "é", "É", "Σ", "σ", "ς", "ΑΣ", "İ", "i", "ß", "SS", "中", "😀", "\uff21", "_", "-", " ", "\t", "\u2028", "key", "Key", "KEY"}
	nums := []string{"0", "-0", "1", "-1", "0.5", "1.0", "100.0", "1e3", "1E-7", "0.000001", "1e21", "1e20", "123456789012345678901234567890", "9007199254740993", "3.141592653589793", "2.5e-5", "-1.25e16"}
	var gen func(depth int) string
	gen = func(depth int) string {
		switch k := r.IntN(7); {
		case depth > 2 || k == 0:
			return nums[r.IntN(len(nums))]
		case k == 1:
			b, _ := json.Marshal(names[r.IntN(len(names))] + names[r.IntN(len(names))])
			return string(b)
		case k == 2:
			return []string{"true", "false", "null"}[r.IntN(3)]
		case k == 3:
			n := r.IntN(4)
			parts := make([]string, n)
			for i := range parts {
				parts[i] = gen(depth + 1)
			}
			return "[" + strings.Join(parts, ", ") + "]"
		default:
			n := 1 + r.IntN(5)
			parts := make([]string, n)
			for i := range parts {
				kb, _ := json.Marshal(names[r.IntN(len(names))])
				parts[i] = string(kb) + ": " + gen(depth+1)
			}
			return "{" + strings.Join(parts, ", ") + "}"
		}
	}
	docs := make([]string, 300)
	for i := range docs {
		docs[i] = gen(0)
	}
	for _, side := range []struct {
		name    string
		dialect powertools.Dialect
	}{{"py", powertools.Python}, {"ts", powertools.TypeScript}} {
		got := peer(t, side.name, map[string]any{"op": "hash", "prefix": "pay", "docs": docs})
		keys, _ := got["keys"].([]any)
		b, err := powertools.New(aws.Config{}, &powertools.Options{Table: "t", KeyPrefix: "pay", Dialect: side.dialect})
		if err != nil {
			t.Fatal(err)
		}
		bad, compared := 0, 0
		for i, d := range docs {
			if i < len(keys) && keys[i] == nil {
				continue // Powertools' "no key" (null, [], all nulls): never hashed, as package idempotency refuses them (ErrNoKey)
			}
			compared++
			ours, err := b.CallKey([]byte(d))
			if err != nil {
				t.Fatal(err)
			}
			if i >= len(keys) || keys[i] != ours {
				bad++
				if bad <= 5 {
					t.Errorf("%s: %s: ours %s, Powertools' %v", side.name, d, ours, keys[min(i, len(keys)-1)])
				}
			}
		}
		if bad > 0 || compared < 250 {
			t.Errorf("%s: %d of %d documents compared hash apart", side.name, bad, compared)
		}
	}
}

// Every write through a transport that forwards then answers 500 (its
// reply lost: the SDK resends, and the resend meets our own token) and
// one that answers 400 throttling past the SDK's retries: a lost reply
// is the success it was; a throttled hold runs nothing; a throttled
// result is reported not recorded, the value returned.
func TestPowertoolsWritesUnderFaults(t *testing.T) {
	t.Parallel()
	declined := errors.New("declined")
	for _, tc := range []struct {
		name  string
		rule  faults.Rule
		fail  bool
		check func(res idempotency.Result[charge], err error, runs int) bool
	}{
		{"hold's reply lost", faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.LostReply}, false,
			func(res idempotency.Result[charge], err error, runs int) bool { return err == nil && runs == 1 }},
		{"hold throttled", faults.Rule{Op: "DynamoDB.PutItem", Fault: faults.Throttle, Times: faults.Attempts}, false,
			func(res idempotency.Result[charge], err error, runs int) bool { return err != nil && runs == 0 }},
		{"result's reply lost", faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.LostReply}, false,
			func(res idempotency.Result[charge], err error, runs int) bool { return err == nil && runs == 1 }},
		{"result throttled", faults.Rule{Op: "DynamoDB.UpdateItem", Fault: faults.Throttle, Times: faults.Attempts}, false,
			func(res idempotency.Result[charge], err error, runs int) bool {
				return errors.Is(err, idempotency.ErrNotRecorded) && res.Value.Charge == "go_1" && runs == 1
			}},
		{"release's reply lost", faults.Rule{Op: "DynamoDB.DeleteItem", Fault: faults.LostReply}, true,
			func(res idempotency.Result[charge], err error, runs int) bool {
				return errors.Is(err, declined) && runs == 1
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, tbl := table(t)
			ft := faults.New(nil)
			s := store(t, faults.Config(cfg, ft), &powertools.Options{Table: tbl, KeyPrefix: "payments"})
			runs := 0
			fn := func(context.Context) (charge, error) {
				runs++
				if tc.fail {
					return charge{}, declined
				}
				return charge{Charge: fmt.Sprintf("go_%d", runs)}, nil
			}
			ft.Add(tc.rule)
			res, err := idempotency.Do(context.Background(), s, "order-f", fn, nil)
			if !tc.check(res, err, runs) {
				t.Fatalf("first call: %+v %v, %d runs", res, err, runs)
			}
			again, err := idempotency.Do(context.Background(), s, "order-f", fn, nil)
			switch {
			case tc.name == "result throttled":
				if !errors.Is(err, idempotency.ErrInProgress) || runs != 1 {
					t.Fatalf("a repeat while the unrecorded hold lasts: %+v %v, %d runs; want in progress", again, err, runs)
				}
			case tc.fail || tc.name == "hold throttled":
				if runs != 1+btoi(tc.fail) || again.Replayed {
					t.Fatalf("a repeat after a key left free: %+v %v, %d runs; want it run", again, err, runs)
				}
			case err != nil || !again.Replayed || again.Value != res.Value || runs != 1:
				t.Fatalf("a repeat: %+v %v, %d runs; want %+v replayed", again, err, runs, res.Value)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Powertools' default layout on the nexjob table (its key is "pk", not
// "id"): the first call fails with an error that names Options.KeyAttr
// and the nexjob table's attributes, and runs nothing (a newcomer read
// "job payments#… may have been written").
func TestWrongKeyAttrIsNamed(t *testing.T) {
	t.Parallel()
	e := nexjobtest.New(t, nil)
	s := store(t, e.Cfg, &powertools.Options{Table: e.Table, KeyPrefix: "payments"})
	runs := 0
	_, err := idempotency.Do(context.Background(), s, "order-1", func(context.Context) (int, error) { runs++; return 1, nil }, nil)
	if err == nil || runs != 0 || !strings.Contains(err.Error(), "Options.KeyAttr") || !strings.Contains(err.Error(), `KeyAttr "pk", ExpiryAttr "expiresAt"`) || strings.Contains(err.Error(), "may have been written") {
		t.Fatalf("the default layout on the nexjob table: %v, %d runs; want an error naming Options.KeyAttr and the nexjob table's attributes, nothing run", err, runs)
	}
}

// The package doc's costs ("a first call is a PutItem and an UpdateItem,
// a repeat one PutItem whose failed condition returns the record"),
// pinned with the write units of the items written (awstest.ItemSize,
// DynamoDB's rule): a small call's hold and record are one unit each; a
// 2.5 KB result's record three. An error releases the hold: PutItem,
// DeleteItem (a delete is billed at the deleted item's size, the hold's).
func TestPowertoolsCallCosts(t *testing.T) {
	t.Parallel()
	cfg, tbl := table(t)
	db := dynamodb.NewFromConfig(cfg) // the test's reads, not counted
	counter := awstest.Count(&cfg)
	s := store(t, cfg, &powertools.Options{Table: tbl, KeyPrefix: "costs"})
	ctx := context.Background()
	size := func(key string) int {
		t.Helper()
		out, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(tbl), Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: s.KeyHash(key)}}, ConsistentRead: aws.Bool(true)})
		if err != nil || len(out.Item) == 0 {
			t.Fatalf("the record of %s: %v %v", key, out.Item, err)
		}
		return awstest.ItemSize(out.Item)
	}
	units := func(n int) int { return (n + 1023) / 1024 }
	calls := func() string { defer counter.Reset(); return strings.Join(counter.Calls(), " ") }
	for _, tc := range []struct {
		name         string
		result       string
		hold, record int // write units
	}{
		{"small", "ok", 1, 1},
		{"2.5 KB", strings.Repeat("r", 2500), 1, 3},
	} {
		hold := 0
		fn := func(context.Context) (string, error) {
			hold = size(tc.name) // the hold, as written
			return tc.result, nil
		}
		counter.Reset()
		res, err := idempotency.Do(ctx, s, tc.name, fn, &idempotency.CallOptions{Payload: "p"})
		if err != nil || res.Replayed {
			t.Fatalf("%s first call: %+v %v", tc.name, res, err)
		}
		if got := calls(); got != "DynamoDB.PutItem DynamoDB.UpdateItem" {
			t.Errorf("%s first call: %s, want PutItem UpdateItem", tc.name, got)
		}
		if u := units(hold); u != tc.hold {
			t.Errorf("%s: the hold is %d bytes, %d units; want %d", tc.name, hold, u, tc.hold)
		}
		if n := size(tc.name); units(n) != tc.record {
			t.Errorf("%s: the record is %d bytes, %d units; want %d", tc.name, n, units(n), tc.record)
		}
		counter.Reset()
		if again, err := idempotency.Do(ctx, s, tc.name, fn, &idempotency.CallOptions{Payload: "p"}); err != nil || !again.Replayed || again.Value != tc.result {
			t.Fatalf("%s repeat: %+v %v", tc.name, again, err)
		}
		if got := calls(); got != "DynamoDB.PutItem" {
			t.Errorf("%s repeat: %s, want one PutItem (billed at the record's %d units)", tc.name, got, tc.record)
		}
	}
	if _, err := idempotency.Do(ctx, s, "declined", func(context.Context) (int, error) { return 0, errors.New("declined") }, nil); err == nil {
		t.Fatal("the call's error: nil")
	}
	if got := calls(); got != "DynamoDB.PutItem DynamoDB.DeleteItem" {
		t.Errorf("an error released: %s, want PutItem DeleteItem", got)
	}
}
