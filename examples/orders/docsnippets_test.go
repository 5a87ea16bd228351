package orders_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/lambdamain"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/nexjobtest"
)

// The package docs' code snippets, compiled here against this example's
// real API (TestDocSnippetsAreThese checks the docs still say them).

func lambdamainDocMain() {
	lambdamain.Serve(orders.Registry(), nil) // the team's kinds, with their hooks
}

func lambdamainDocLocal() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := lambdamain.Local(ctx, orders.Registry(), nil)
	stop() // before log.Fatal, which runs no deferred call
	if err != nil {
		log.Fatal(err)
	}
}

func TestReceipt(t *testing.T) {
	ctx := context.Background()
	e := nexjobtest.New(t, nil)
	h := e.Handler(t, orders.Registry(), nil)
	res, _ := e.Client.Enqueue(ctx, orders.Receipt{OrderID: "1"}, &enqueue.Opts{Delay: time.Hour})
	e.Drain(t, h)           // nothing due: the receipt waits, Scheduled
	e.Advance(t, time.Hour) // the kit's clock, not a sleep
	e.Drain(t, h)           // due now: it runs
	e.RequireState(t, res.ID, ledger.Succeeded)
}

var _ = []func(){lambdamainDocMain, lambdamainDocLocal}

// TestDocSnippetsAreThese: every line of the snippets in lambdamain's
// and nexjobtest's package docs is a line of this package's tests (spaces
// aside), so
// a doc that drifts from the API fails here instead of misleading.
func TestDocSnippetsAreThese(t *testing.T) {
	here := map[string]bool{"func main() {": true} // each snippet's main is a named func here
	for _, name := range []string{"docsnippets_test.go", "orders_test.go"} {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			here[strings.Join(strings.Fields(l), " ")] = true
		}
	}
	for _, dir := range []string{"../../lambdamain", "../../nexjobtest"} {
		names, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(names) == 0 {
			t.Fatalf("the package's files in %s: %v %v", dir, names, err)
		}
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			for _, cg := range append([]*ast.CommentGroup{f.Doc}, declDocs(f)...) {
				if cg == nil {
					continue
				}
				for _, l := range strings.Split(cg.Text(), "\n") {
					if !strings.HasPrefix(l, "\t") || strings.TrimSpace(l) == "" {
						continue
					}
					if n := strings.Join(strings.Fields(l), " "); !here[n] {
						t.Errorf("%s: the doc snippet line %q is not compiled in docsnippets_test.go", dir, n)
					}
				}
			}
		}
	}
}

func declDocs(f *ast.File) []*ast.CommentGroup {
	var out []*ast.CommentGroup
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Doc != nil && (fd.Name.Name == "Local" || fd.Name.Name == "Main") {
			out = append(out, fd.Doc)
		}
	}
	return out
}
