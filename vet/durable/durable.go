// Package durable is a go/analysis analyzer for durable jobs' code
// (package handler): the mistakes that replay, renames and sleeps punish,
// found before a deploy. Run it with go vet:
//
//	go install github.com/nexjob/nexjob-aws/cmd/nexjob-vet@latest
//	go vet -vettool=$(which nexjob-vet) ./...
//
// It reports:
//   - the error of Sleep, SleepUntil, WaitForSignal, WaitForAny,
//     WaitForCondition, Invoke, Await or AwaitAll dropped (a call whose
//     result is not used, or assigned to _): the run goes on past a sleep
//     or a wait (the handler then ends it in the sleep, with a warning);
//   - a step's name (Step, StepWith, Sleep, SleepUntil, WaitForSignal,
//     InvokeAsync, Invoke, Compensate, WaitForCondition, Map) that the
//     ledger refuses: empty, over 128 bytes, or beginning "nexjob:";
//   - a step's name built from time.Now, a random number, or a map's
//     range variable: the next run names the step differently and runs
//     its function again;
//   - Step or StepWith called in a goroutine (a go statement's function):
//     use handler.Map, which records each item's step and bounds them;
//   - Compensate called inside a Step's, StepWith's or Map's function: a
//     replay does not call it (handler.CompensateInStepError at run time);
//   - an if or switch whose condition reads time.Now or a random number
//     and whose branches record steps: which step runs next must be
//     decided inside a step (its result recorded), or the replay takes
//     another branch.
//
// How it fails: it reads code, not values: a name from a variable it
// cannot see through is not reported (false negatives, never a refusal of
// good code for a value it does not know).
package durable

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/types"
	"slices"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Analyzer is the durable-code analyzer.
var Analyzer = &analysis.Analyzer{
	Name:     "nexjobdurable",
	Doc:      "reports durable-job code that replays differently, repeats side effects or drops a sleep (package handler)",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      run,
}

const handlerPath = "github.com/nexjob/nexjob-aws/handler"

// waits are the calls whose error must be returned.
var waits = map[string]bool{"Sleep": true, "SleepUntil": true, "WaitForSignal": true, "WaitForAny": true, "WaitForCondition": true, "Invoke": true, "Await": true, "AwaitAll": true}

// named are the calls whose second argument is a step's name.
var named = map[string]bool{"Step": true, "StepWith": true, "Sleep": true, "SleepUntil": true, "WaitForSignal": true, "InvokeAsync": true, "Invoke": true, "Compensate": true, "WaitForCondition": true, "Map": true}

// steps are the calls that record a step.
var steps = map[string]bool{"Step": true, "StepWith": true}

// handlerFunc is the name of the package handler function call calls, or "".
func handlerFunc(info *types.Info, call *ast.CallExpr) string {
	fun := call.Fun
	if ix, ok := fun.(*ast.IndexExpr); ok { // Step[T](...)
		fun = ix.X
	}
	if ix, ok := fun.(*ast.IndexListExpr); ok {
		fun = ix.X
	}
	sel, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	obj, ok := info.Uses[sel.Sel].(*types.Func)
	if !ok || obj.Pkg() == nil || obj.Pkg().Path() != handlerPath {
		return ""
	}
	return obj.Name()
}

func run(pass *analysis.Pass) (any, error) {
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	mapVars := map[types.Object]bool{}
	ins.Preorder([]ast.Node{(*ast.RangeStmt)(nil)}, func(n ast.Node) {
		r := n.(*ast.RangeStmt)
		if _, ok := pass.TypesInfo.TypeOf(r.X).Underlying().(*types.Map); !ok {
			return
		}
		for _, e := range []ast.Expr{r.Key, r.Value} {
			if id, ok := e.(*ast.Ident); ok {
				if obj := pass.TypesInfo.Defs[id]; obj != nil {
					mapVars[obj] = true
				}
			}
		}
	})
	ins.WithStack([]ast.Node{(*ast.CallExpr)(nil), (*ast.IfStmt)(nil), (*ast.SwitchStmt)(nil)}, func(n ast.Node, push bool, stack []ast.Node) bool {
		if !push {
			return true
		}
		switch n := n.(type) {
		case *ast.CallExpr:
			checkCall(pass, n, stack, mapVars)
		case *ast.IfStmt:
			checkBranch(pass, n.Cond, n)
		case *ast.SwitchStmt:
			if n.Tag != nil {
				checkBranch(pass, n.Tag, n)
			}
		}
		return true
	})
	return nil, nil
}

func checkCall(pass *analysis.Pass, call *ast.CallExpr, stack []ast.Node, mapVars map[types.Object]bool) {
	name := handlerFunc(pass.TypesInfo, call)
	if name == "" {
		return
	}
	what := called(pass, name, call)
	if waits[name] && len(stack) >= 2 {
		switch p := stack[len(stack)-2].(type) {
		case *ast.ExprStmt:
			pass.Reportf(call.Pos(), "the error of %s is dropped: return it (the run must end in the sleep or wait)", what)
		case *ast.AssignStmt:
			if last, ok := p.Lhs[len(p.Lhs)-1].(*ast.Ident); ok && last.Name == "_" && len(p.Rhs) == 1 {
				pass.Reportf(call.Pos(), "the error of %s is assigned to _: return it (the run must end in the sleep or wait)", what)
			}
		}
	}
	if named[name] && len(call.Args) >= 2 {
		arg := call.Args[1]
		if tv, ok := pass.TypesInfo.Types[arg]; ok && tv.Value != nil && tv.Value.Kind() == constant.String {
			s := constant.StringVal(tv.Value)
			switch {
			case s == "" || len(s) > 128:
				pass.Reportf(arg.Pos(), "handler.%s's name %q: a step's name is 1 to 128 bytes", name, trim(s))
			case strings.HasPrefix(s, "nexjob:"):
				pass.Reportf(arg.Pos(), "handler.%s's name %q: names beginning \"nexjob:\" are the package's own", name, trim(s))
			}
		} else if why := unstable(pass, arg, mapVars); why != "" {
			pass.Reportf(arg.Pos(), "%s: its name is built from %s: the next run names it differently and runs it again", what, why)
		}
	}
	if name == "Compensate" {
		// Inside a step's function (a Step's, a Map item's): a replay
		// does not call it, so the compensation would not be declared.
		for i := len(stack) - 2; i > 0; i-- {
			if lit, ok := stack[i].(*ast.FuncLit); ok {
				if outer, ok := stack[i-1].(*ast.CallExpr); ok && slices.Contains(outer.Args, ast.Expr(lit)) {
					if o := handlerFunc(pass.TypesInfo, outer); o == "Step" || o == "StepWith" || o == "Map" {
						pass.Reportf(call.Pos(), "%s inside %s's function: a replay does not call it, so the compensation is not declared; declare it after the step returned", what, called(pass, o, outer))
						break
					}
				}
			}
		}
	}
	if steps[name] {
		for i := len(stack) - 2; i >= 0; i-- {
			if lit, ok := stack[i].(*ast.FuncLit); ok && i > 0 {
				if g, ok := stack[i-1].(*ast.CallExpr); ok && i > 1 {
					if _, ok := stack[i-2].(*ast.GoStmt); ok && g.Fun == lit {
						pass.Reportf(call.Pos(), "%s in a goroutine: use handler.Map, which records each item's step and bounds how many run", what)
						return
					}
				}
			}
		}
	}
}

// called is the call as a report names it: handler.Name and its step's
// name, as written (handler.Step("charge"), handler.Step("t-" + tenant)).
func called(pass *analysis.Pass, name string, call *ast.CallExpr) string {
	if !named[name] || len(call.Args) < 2 {
		return "handler." + name
	}
	arg := call.Args[1]
	if tv, ok := pass.TypesInfo.Types[arg]; ok && tv.Value != nil && tv.Value.Kind() == constant.String {
		return fmt.Sprintf("handler.%s(%q)", name, trim(constant.StringVal(tv.Value)))
	}
	return fmt.Sprintf("handler.%s(%s)", name, trim(types.ExprString(arg)))
}

// unstable says what in e changes from run to run ("" if nothing seen).
func unstable(pass *analysis.Pass, e ast.Expr, mapVars map[types.Object]bool) string {
	why := ""
	ast.Inspect(e, func(n ast.Node) bool {
		if why != "" {
			return false
		}
		switch n := n.(type) {
		case *ast.Ident:
			if mapVars[pass.TypesInfo.Uses[n]] {
				why = "a map's range variable (a map's order changes)"
			}
		case *ast.SelectorExpr:
			if obj, ok := pass.TypesInfo.Uses[n.Sel].(*types.Func); ok && obj.Pkg() != nil {
				switch p := obj.Pkg().Path(); {
				case p == "time" && obj.Name() == "Now":
					why = "time.Now"
				case p == "math/rand" || p == "math/rand/v2" || p == "crypto/rand":
					why = "a random number"
				}
			}
		}
		return true
	})
	return why
}

// checkBranch reports a branch decided by the clock or chance whose
// bodies record steps.
func checkBranch(pass *analysis.Pass, cond ast.Expr, stmt ast.Node) {
	why := unstable(pass, cond, nil)
	if why == "" {
		return
	}
	records := false
	ast.Inspect(stmt, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok && named[handlerFunc(pass.TypesInfo, c)] {
			records = true
		}
		return !records
	})
	if records {
		pass.Reportf(cond.Pos(), "which step runs next is decided by %s outside a step: decide it in a step (its result is recorded), or the replay may take another branch", why)
	}
}

func trim(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
