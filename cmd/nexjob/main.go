// Command nexjob is the project's command line: the demo that `make run`
// runs, provisioning for local emulators, and job administration.
//
//	nexjob demo                      run the seed's jobs end to end and print the tables
//	nexjob provision NAME            create table NAME and queues NAME, NAME-dlq; print export lines:
//	                                 eval "$(nexjob provision NAME)" points a shell at them
//	nexjob schema                    print the table definition for the AWS CLI (LocalStack's hook)
//	nexjob get     -table T ID       print a job's record
//	nexjob requeue -table T -queue URL ID   requeue a terminal job
//	nexjob delete  -table T ID       delete a job (frees its key)
//	nexjob list    -table T STATE    list jobs in a state, newest first
//
// AWS settings come from the standard SDK environment (AWS_ENDPOINT_URL,
// AWS_REGION, credentials).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/provision"
	"github.com/nexjob/nexjob-aws/settings"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "nexjob:", err)
		os.Exit(1)
	}
}

func usage() error {
	return fmt.Errorf("usage: nexjob demo | provision NAME | schema | get|delete -table T ID | requeue -table T -queue URL ID | list -table T STATE")
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usage()
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return err
	}
	if cfg.Region == "" {
		return settings.ErrNoRegion
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	table := fs.String("table", os.Getenv("NEXJOB_TABLE"), "ledger table (env NEXJOB_TABLE)")
	queue := fs.String("queue", os.Getenv("NEXJOB_QUEUE_URL"), "job queue URL (env NEXJOB_QUEUE_URL)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "demo":
		return demo(ctx, cfg, os.Stdout)
	case "schema":
		out, err := provision.TableJSON("nexjob")
		if err != nil {
			return err
		}
		fmt.Println(string(out))
		return nil
	case "provision":
		if fs.NArg() != 1 {
			return usage()
		}
		name := fs.Arg(0)
		if err := provision.Table(ctx, dynamodb.NewFromConfig(cfg), name); err != nil {
			return err
		}
		q, dlq, err := provision.Queues(ctx, sqs.NewFromConfig(cfg), provision.QueueSpec{Name: name})
		if err != nil {
			return err
		}
		printExports(os.Stdout, cfg, map[string]string{settings.EnvTable: name, settings.EnvQueueURL: q, settings.EnvDLQURL: dlq})
		return nil
	case "requeue":
		if fs.NArg() != 1 {
			return usage()
		}
		c, err := enqueue.New(cfg, *table, *queue, nil)
		if err != nil {
			return err
		}
		res, err := c.Requeue(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		fmt.Printf("requeued %s: %s\n", res.ID, res.State)
		return nil
	case "get", "delete", "list":
		if fs.NArg() != 1 {
			return usage()
		}
		s, err := ledger.New(dynamodb.NewFromConfig(cfg), *table, nil)
		if err != nil {
			return err
		}
		switch args[0] {
		case "delete":
			return s.Delete(ctx, fs.Arg(0))
		case "list":
			return list(ctx, s, ledger.State(fs.Arg(0)))
		}
		rec, err := s.Get(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		rec.Args = fmt.Sprintf("(%d bytes, not shown)", len(rec.Args))
		out, _ := json.MarshalIndent(rec, "", "  ")
		fmt.Println(string(out))
		return nil
	}
	return usage()
}

// list prints every job in the state, newest first, a page at a time.
func list(ctx context.Context, s *ledger.Store, st ledger.State) error {
	cursor := ""
	for {
		recs, next, err := s.List(ctx, st, 50, cursor)
		if err != nil {
			return err
		}
		for _, r := range recs {
			fmt.Printf("%s\t%s\t%s\tattempt %d/%d\t%s\n", ledger.Millis(r.UpdatedAt).UTC().Format(time.RFC3339), r.ID, r.Kind, r.Attempt, r.MaxAttempts, r.LastError)
		}
		if next == "" {
			return nil
		}
		cursor = next
	}
}

// printExports prints shell export lines for the nexjob variables and the
// SDK settings that reach the same backend: the endpoint and, for an
// emulator, its region and dummy credentials (nothing secret of a real
// account is printed).
func printExports(w io.Writer, cfg aws.Config, vars map[string]string) {
	if ep := os.Getenv("AWS_ENDPOINT_URL"); ep != "" {
		vars["AWS_ENDPOINT_URL"] = ep
		vars["AWS_REGION"] = cfg.Region
		if id := os.Getenv("AWS_ACCESS_KEY_ID"); id == "test" || os.Getenv("NEXJOB_EMULATOR") != "" {
			vars["AWS_ACCESS_KEY_ID"], vars["AWS_SECRET_ACCESS_KEY"] = "test", "test"
		}
	}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "export %s=%s\n", k, shellQuote(vars[k]))
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
