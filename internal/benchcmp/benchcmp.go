// Package benchcmp measures this project's calls against the bare SDK
// calls they make, in one run, and prints the ratios.
//
// Canned is an in-process HTTP endpoint that answers DynamoDB and SQS
// requests with fixed, valid replies, so a benchmark against it measures
// the client's own CPU and allocations (the SDK's included, the network's
// and the backend's not). Ratio runs two benchmark functions and prints
// "ours/bare" for time and allocations. The endpoint's own work is counted
// in both and so pulls a ratio toward 1 a little; it is kept small (one
// read of the body, a canned write).
package benchcmp

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Canned is the in-process endpoint. Update answers UpdateItem: it gets
// the request body and returns the reply's body; nil answers "{}" (no
// attributes).
type Canned struct {
	URL    string
	Update func(body []byte) []byte
	srv    *httptest.Server
	mu     sync.Mutex
	sizes  map[string]int
}

// Size is the body size of the last request of the operation (the
// X-Amz-Target's, "DynamoDB_20120810.PutItem"), so a benchmark can check
// that its bare side sends requests of the same size as its own.
func (c *Canned) Size(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sizes[op]
}

// NewCanned starts an endpoint, closed when tb ends.
func NewCanned(tb testing.TB) *Canned {
	c := &Canned{sizes: map[string]int{}}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	c.URL = c.srv.URL
	tb.Cleanup(c.srv.Close)
	return c
}

// Config is an SDK configuration whose clients talk to the endpoint, with
// the SDK's standard retryer and HTTP client, as a user's would.
func (c *Canned) Config() aws.Config {
	return aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("bench", "bench", ""),
		BaseEndpoint: aws.String(c.URL),
	}
}

// S and N are DynamoDB string and number values, for the bare sides.
func S(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func N(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }

var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (c *Canned) serve(w http.ResponseWriter, r *http.Request) {
	buf := bodies.Get().(*bytes.Buffer)
	defer bodies.Put(buf)
	buf.Reset()
	if _, err := io.Copy(buf, r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	op := r.Header.Get("X-Amz-Target")
	c.mu.Lock()
	c.sizes[op] = buf.Len()
	c.mu.Unlock()
	switch op {
	case "DynamoDB_20120810.PutItem", "DynamoDB_20120810.TransactWriteItems":
		_, _ = io.WriteString(w, "{}")
	case "DynamoDB_20120810.UpdateItem":
		if c.Update == nil {
			_, _ = io.WriteString(w, "{}")
			return
		}
		_, _ = w.Write(c.Update(buf.Bytes()))
	case "AmazonSQS.SendMessage":
		_, _ = io.WriteString(w, `{"MessageId":"00000000-0000-0000-0000-000000000000"}`)
	case "AmazonSQS.SendMessageBatch":
		var in struct{ Entries []struct{ Id string } }
		if err := json.Unmarshal(buf.Bytes(), &in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		type ok struct{ Id, MessageId string }
		out := struct{ Successful []ok }{}
		for _, e := range in.Entries {
			out.Successful = append(out.Successful, ok{Id: e.Id, MessageId: "m-" + e.Id})
		}
		_ = json.NewEncoder(w).Encode(out)
	default:
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"__type":"UnknownOperationException","message":"canned endpoint: %s"}`, op)
	}
}

// Side is one side's measure: time and allocations per operation.
type Side struct {
	NsPerOp, AllocsPerOp float64
}

var (
	baseMu sync.Mutex
	bases  = map[*testing.B]*runtime.MemStats{}
)

// baseline starts counting b's allocations.
func baseline(b *testing.B) *runtime.MemStats {
	m := new(runtime.MemStats)
	runtime.ReadMemStats(m)
	baseMu.Lock()
	bases[b] = m
	baseMu.Unlock()
	return m
}

func forget(b *testing.B) {
	baseMu.Lock()
	delete(bases, b)
	baseMu.Unlock()
}

// ResetTimer is b.ResetTimer for a side of Ratio: it also leaves the
// allocations made so far (the side's setup) out of its count.
func ResetTimer(b *testing.B) {
	baseMu.Lock()
	m := bases[b]
	baseMu.Unlock()
	if m != nil {
		runtime.ReadMemStats(m)
	}
	b.ResetTimer()
}

// Result is one comparison.
type Result struct {
	Name       string
	Ours, Bare Side // each side's median round
	// TimeX and AllocsX are the medians of the rounds' ours/bare ratios
	// (each round runs the two sides back to back); Lo and Hi their
	// spread, the lowest and the highest round.
	TimeX, AllocsX     float64
	TimeLo, TimeHi     float64
	AllocsLo, AllocsHi float64
}

func (r Result) String() string {
	return fmt.Sprintf("%-40s time %.2fx [%.2f-%.2f] (%.0f vs %.0f ns/op), allocations %.2fx [%.2f-%.2f] (%.0f vs %.0f allocs/op), median of %d rounds",
		r.Name, r.TimeX, r.TimeLo, r.TimeHi, r.Ours.NsPerOp, r.Bare.NsPerOp, r.AllocsX, r.AllocsLo, r.AllocsHi, r.Ours.AllocsPerOp, r.Bare.AllocsPerOp, Rounds)
}

// Rounds is how many times Ratio runs each side. Each round runs the two
// back to back, the order turning every round (ours first, then bare
// first), so neither side always runs warm or always cold; a round's
// ratio pairs runs made under the same load.
const Rounds = 5

// Ratio runs ours and bare as the sub-benchmarks name/ours and name/bare,
// Rounds times each, the order rotated (with the run's -benchtime; the
// framework prints every round's figures), and prints a line "ratio NAME
// time X [lo-hi], allocations Y [lo-hi]": the median over the rounds of
// ours / bare per operation, and the spread. Allocations are counted over
// the whole process while a side runs, as -benchmem counts them.
func Ratio(b *testing.B, name string, ours, bare func(*testing.B)) Result {
	b.Helper()
	r := Result{Name: name}
	var times, allocs []float64
	var oursRuns, bareRuns []Side
	b.Run(name, func(b *testing.B) {
		for round := range Rounds {
			sides := []struct {
				name string
				f    func(*testing.B)
				to   *[]Side
			}{{"ours", ours, &oursRuns}, {"bare", bare, &bareRuns}}
			if round%2 == 1 {
				sides[0], sides[1] = sides[1], sides[0]
			}
			for _, s := range sides {
				var last Side // the framework's last call: the round's full run
				b.Run(s.name, func(b *testing.B) {
					b.ReportAllocs()
					m0 := baseline(b)
					defer forget(b)
					s.f(b)
					var m1 runtime.MemStats
					runtime.ReadMemStats(&m1)
					last = Side{
						NsPerOp:     float64(b.Elapsed().Nanoseconds()) / float64(b.N),
						AllocsPerOp: float64(m1.Mallocs-m0.Mallocs) / float64(b.N),
					}
				})
				*s.to = append(*s.to, last)
			}
			o, bb := oursRuns[len(oursRuns)-1], bareRuns[len(bareRuns)-1]
			if o.NsPerOp > 0 && bb.NsPerOp > 0 {
				times = append(times, o.NsPerOp/bb.NsPerOp)
				allocs = append(allocs, o.AllocsPerOp/bb.AllocsPerOp)
			}
		}
	})
	if len(times) != Rounds {
		b.Fatalf("%s: a side did not run", name)
	}
	r.TimeX, r.TimeLo, r.TimeHi = spread(times)
	r.AllocsX, r.AllocsLo, r.AllocsHi = spread(allocs)
	r.Ours, r.Bare = medianSide(oursRuns), medianSide(bareRuns)
	fmt.Printf("ratio %s\n", r)
	return r
}

// spread is the median, the lowest and the highest of v.
func spread(v []float64) (median, lo, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2], s[0], s[len(s)-1]
}

// medianSide is the side's round of median time.
func medianSide(runs []Side) Side {
	s := slices.Clone(runs)
	slices.SortFunc(s, func(a, b Side) int { return cmp.Compare(a.NsPerOp, b.NsPerOp) })
	return s[len(s)/2]
}
