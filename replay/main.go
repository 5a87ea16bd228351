package replay

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/settings"
)

// Main is a team's deploy check, whole: call it from a main of the
// team's own, with the registry its worker builds (a registry is the
// team's code, so no binary of ours can hold it):
//
//	func main() { replay.Main(app.Registry()) } // cmd/deploy-check
//
// Run with the deployment's operator settings (NEXJOB_TABLE, … as for the
// nexjob CLI, read only: the byState index, the table's records and the
// steps table), it reads the open jobs of every registered kind (or of
// -kind k1,k2) and replays them; with -file PATH it checks that export
// instead (CI, no AWS). It prints each divergence and exits 1 when there
// is one, 2 when it could not check, 0 when every job replays.
func Main(reg *handler.Registry) {
	os.Exit(Run(context.Background(), reg, os.Args[1:], os.Stdout))
}

// Run is Main's body: args its flags, the report written to out; it
// returns the exit code.
func Run(ctx context.Context, reg *handler.Registry, args []string, out io.Writer) int {
	fs := flag.NewFlagSet("deploy-check", flag.ContinueOnError)
	fs.SetOutput(out)
	kinds := fs.String("kind", "", "the kinds to check, comma-separated (default: every registered kind)")
	file := fs.String("file", "", "check this export (nexjob export KIND) instead of the live table")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var exports []Export
	if *file != "" {
		ex, err := ReadFile(*file)
		if err != nil {
			fmt.Fprintln(out, err)
			return 2
		}
		exports = append(exports, ex)
	} else {
		s, err := settings.Load(ctx, settings.Operator)
		if err != nil {
			fmt.Fprintln(out, err)
			return 2
		}
		c, err := s.Client(nil)
		if err != nil {
			fmt.Fprintln(out, err)
			return 2
		}
		list := reg.Kinds()
		if *kinds != "" {
			list = strings.Split(*kinds, ",")
		}
		for _, k := range list {
			ex, err := Read(ctx, c.Store(), k, nil)
			if err != nil {
				fmt.Fprintln(out, err)
				return 2
			}
			exports = append(exports, ex)
		}
	}
	code := 0
	for _, ex := range exports {
		rep, err := Check(ctx, reg, ex)
		if err != nil {
			fmt.Fprintln(out, err)
			return 2
		}
		fmt.Fprintf(out, "%s: %d open jobs replayed, %d not started, %d divergences\n", ex.Kind, rep.Jobs, rep.NotStarted, len(rep.Divergences))
		for _, d := range rep.Divergences {
			fmt.Fprintln(out, "  "+d.String())
		}
		for _, u := range rep.Unchecked {
			fmt.Fprintln(out, "  unchecked: "+u)
		}
		if len(rep.Divergences) > 0 {
			code = 1
		}
	}
	return code
}
