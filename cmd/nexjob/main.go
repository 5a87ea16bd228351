// Command nexjob is the project's command line: the demo that `make run`
// runs, provisioning for local emulators, and the operator's tools.
// `nexjob help` prints the commands. Flags may come before or after the
// arguments.
//
// The deployment comes from the same variables the functions read
// (package settings: NEXJOB_TABLE, NEXJOB_QUEUE_URL, NEXJOB_DLQ_URL, …),
// or from --table, --queue and --dlq; AWS settings from the standard SDK
// environment (AWS_ENDPOINT_URL, AWS_REGION, credentials).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/nexjob/nexjob-aws/nexjobtest"
	"github.com/nexjob/nexjob-aws/replay"
	"github.com/nexjob/nexjob-aws/settings"
)

const usageText = `nexjob: NexJob-style background jobs on AWS

usage: nexjob COMMAND [flags] [args]

  demo [--dashboard ADDR] [--write]   run the seed's jobs end to end and print the tables;
                                      with --dashboard, then serve the dashboard on the demo's data
  provision NAME [--queues A,B] [--recurring]
                                      create table NAME and queues NAME, NAME-dlq (and NAME-A, NAME-A-dlq for
                                      each named queue; with --recurring, on an emulator, schedule group
                                      NAME-recurring, which lambdamain.Local fires) and print export lines:
                                      eval "$(nexjob provision NAME --queues bulk --recurring)" points a shell at them
  schema [steps]                      print the table definition (with steps: the steps table's) for the AWS CLI (LocalStack's hook)
  emulator                            start the default emulator (moto, installed once) on 127.0.0.1 and
                                      print its export lines, until Ctrl-C: no Docker, no repository
  emulator --install                  install it and exit (where tests look for it): before a first go test

  list [STATE | --state S] [--kind K] [--since 24h] [--until 1h] [--limit 50]
                                      jobs in a state (default Failed), newest first
  get ID [--show-args] [--show-result] [--show-steps]
                                      one job's record and its timeline (args, result, step values only when asked)
  patches KIND NAME                   open jobs of KIND by whether their code knew patch NAME (exits 1 while any lacks it)
  export KIND [--redact]              the open jobs of KIND with their steps, as JSON, for a deploy's replay check (package replay)
  holder KEY [--show-args]            the job that holds an idempotency key (as get prints it), or
                                      that none does: who blocks my enqueue?
  stats                               jobs per state and kind, queue and DLQ depth (scans the table)
  schedules                           recurring jobs: expression, concurrency, next firing
  cancel ID... [--reason R]           withdraw Enqueued or Scheduled jobs: each becomes Failed, marked
                                      cancelled, kept for the failed retention
  signal ID NAME JSON                 send a waiting job its signal NAME (handler.WaitForSignal) with
                                      a JSON payload, e.g. nexjob signal JOB approval '{"by":"ada"}'
  requeue ID...                       run terminal jobs again (a continuation only after
                                      its parents Succeed: it waits for them again)
  requeue --state S [--kind K] [--since D] [--limit N]
                                      requeue every match, with a progress bar (parents
                                      first; their continuations wait for them)
  delete ID...                        remove jobs' records (frees their keys; their waiting
                                      continuations end, or run if the job Succeeded)
  redrive [--from NAME]               move the DLQ's (or named queue NAME's DLQ's) messages back into work
  move-queue NAME [--to OTHER]        move the active jobs whose records name queue NAME (one taken
                                      out of NEXJOB_QUEUES) onto the job queue, or named queue OTHER
                                      (requeue, delete, redrive and move-queue ask first on a terminal:
                                      --yes skips the question, --dry-run changes nothing)
  dashboard [--addr 127.0.0.1:8080] [--write] [--allow-host NAME] [--allow-remote]
                                      serve the web dashboard (read-only without --write;
                                      loopback only unless --allow-remote)
  help                                this text

deployment flags (default: the NEXJOB_* variables): --table T --queue URL --dlq URL
demo and provision with no AWS_ENDPOINT_URL name the real AWS account and region and ask (--yes in scripts)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM) // a kill stops the emulator too
	c := &cli{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, stdin: os.Stdin}
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		c.tty = true
	}
	if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		c.interactive = c.tty
	}
	err := c.run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nexjob:", clean(message(err)))
		os.Exit(1)
	}
}

// message is err's text with the "nexjob: " prefixes of wrapped errors
// taken out, so the line says it once.
func message(err error) string {
	return strings.TrimPrefix(strings.ReplaceAll(err.Error(), ": nexjob: ", ": "), "nexjob: ")
}

// cli is one invocation: its output streams and environment.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	tty            bool // stderr is a terminal: draw the progress bar in place
	stdin          io.Reader
	interactive    bool // stdin and stderr are terminals: ask before bulk actions and real accounts
}

// usageError is a mistake in the command line; the usage hint follows it.
type usageError string

func (u usageError) Error() string { return string(u) + " (nexjob help lists the commands)" }

// flags is every flag any command takes; each command reads its own.
type flags struct {
	table, queue, dlq   string
	from                string // redrive: the named queue whose DLQ
	queues              string // provision: named queues to create, comma-separated
	recurring           bool   // provision: a schedule group for recurring jobs, fired by lambdamain.Local
	to                  string // move-queue: the queue the jobs go to ("" the job queue)
	state, kind, reason string
	since, until, addr  string
	limit               int
	showArgs, write     bool
	showResult          bool
	showSteps           bool
	dashboard           string
	allowRemote         bool
	allowHosts          hostList
	yes, dryRun         bool
	redact              bool // export: blank args and values
}

// hostList is a repeatable flag.
type hostList []string

func (h *hostList) String() string     { return strings.Join(*h, ",") }
func (h *hostList) Set(v string) error { *h = append(*h, v); return nil }

func (c *cli) parse(cmd string, args []string) (*flags, []string, error) {
	f := &flags{}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.table, "table", "", "ledger table")
	fs.StringVar(&f.queue, "queue", "", "job queue URL")
	fs.StringVar(&f.dlq, "dlq", "", "dead-letter queue URL")
	fs.StringVar(&f.from, "from", "", "redrive: the DLQ of this named queue (NEXJOB_QUEUES)")
	fs.StringVar(&f.to, "to", "", "move-queue: the named queue the jobs go to (default the job queue)")
	fs.StringVar(&f.queues, "queues", "", "provision: named queues to create too, comma-separated (bulk,reports)")
	fs.BoolVar(&f.recurring, "recurring", false, "provision: a schedule group for recurring jobs (emulators only: lambdamain.Local fires them)")
	fs.StringVar(&f.state, "state", "", "job state")
	fs.StringVar(&f.kind, "kind", "", "job kind")
	fs.StringVar(&f.since, "since", "", "changed at most this long ago (24h) or since this RFC 3339 time")
	fs.StringVar(&f.until, "until", "", "changed at least this long ago or before this time")
	fs.IntVar(&f.limit, "limit", 0, "at most this many")
	fs.StringVar(&f.reason, "reason", "", "why (cancel)")
	fs.BoolVar(&f.showArgs, "show-args", false, "print the job's args")
	fs.BoolVar(&f.showResult, "show-result", false, "print the job's result")
	fs.BoolVar(&f.showSteps, "show-steps", false, "print each step's value in the job's timeline (escaped, capped)")
	fs.BoolVar(&f.write, "write", false, "allow the dashboard's write actions")
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8080", "the dashboard's address")
	fs.StringVar(&f.dashboard, "dashboard", "", "after the demo, serve the dashboard on this address")
	fs.BoolVar(&f.allowRemote, "allow-remote", false, "let the dashboard listen on a non-loopback address")
	fs.Var(&f.allowHosts, "allow-host", "a further Host the dashboard answers (a proxy's name); repeatable")
	fs.BoolVar(&f.yes, "yes", false, "do not ask before a bulk action or a real AWS account")
	fs.BoolVar(&f.redact, "redact", false, "export: blank args and values (strings, numbers, booleans), keeping their shape")
	fs.BoolVar(&f.dryRun, "dry-run", false, "say what a bulk action would do, and do nothing")
	// Flags anywhere: parse, take one argument, parse the rest again.
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, usageError(fmt.Sprintf("%s: %v", cmd, err))
		}
		if fs.NArg() == 0 {
			return f, rest, nil
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func (c *cli) run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError("no command")
	}
	cmd := args[0]
	switch cmd {
	case "help", "-h", "-help", "--help":
		_, err := fmt.Fprint(c.stdout, usageText)
		return err
	case "emulator":
		if len(args) > 1 && (args[1] == "--install" || args[1] == "-install") {
			return c.installEmulator()
		}
		if len(args) > 1 {
			return usageError("emulator takes no argument but --install")
		}
		return c.emulator(ctx)
	}
	f, rest, err := c.parse(cmd, args[1:])
	if err != nil {
		return err
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return fmt.Errorf("AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return settings.ErrNoRegion
	}
	want := func(n int) error {
		if len(rest) < n {
			return usageError(fmt.Sprintf("%s needs %d argument(s)", cmd, n))
		}
		return nil
	}
	switch cmd {
	case "demo":
		if err := c.realAccount(ctx, cfg, f, "demo creates a table and two queues"); err != nil {
			return err
		}
		return c.demo(ctx, cfg, f)
	case "schema":
		return c.schema(len(rest) > 0 && rest[0] == "steps")
	case "provision":
		if err := want(1); err != nil {
			return err
		}
		if err := c.realAccount(ctx, cfg, f, "provision "+clean(rest[0])+" creates a table and two queues"); err != nil {
			return err
		}
		return c.provision(ctx, cfg, rest[0], f.queues, f.recurring)
	case "list", "get", "holder", "stats", "cancel", "requeue", "delete", "redrive", "move-queue", "dashboard", "schedules", "signal", "patches", "export":
	default:
		return usageError(fmt.Sprintf("unknown command %q", cmd))
	}
	s, err := c.settings(ctx, cfg, f)
	if err != nil {
		return err
	}
	op, err := newOps(c, s)
	if err != nil {
		return err
	}
	switch cmd {
	case "list":
		if f.state == "" && len(rest) > 0 {
			f.state = rest[0] // nexjob list Failed
		}
		return op.list(ctx, f)
	case "get":
		if err := want(1); err != nil {
			return err
		}
		return op.get(ctx, rest[0], show{args: f.showArgs, result: f.showResult, steps: f.showSteps})
	case "holder":
		if err := want(1); err != nil {
			return err
		}
		return op.holder(ctx, rest[0], show{args: f.showArgs, result: f.showResult, steps: f.showSteps})
	case "stats":
		return op.stats(ctx)
	case "patches":
		if err := want(2); err != nil {
			return err
		}
		return op.patches(ctx, rest[0], rest[1])
	case "export":
		if err := want(1); err != nil {
			return err
		}
		ex, err := replay.Read(ctx, op.a.Store(), rest[0], &replay.Options{Redact: f.redact, Limit: f.limit})
		if err != nil {
			return err
		}
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(ex)
	case "schedules":
		return op.schedules(ctx)
	case "cancel":
		if err := want(1); err != nil {
			return err
		}
		return op.each(rest, func(id string) (string, error) { return op.cancel(ctx, id, f.reason) })
	case "requeue":
		if f.state != "" {
			return op.requeueAll(ctx, f)
		}
		if err := want(1); err != nil {
			return err
		}
		return op.bulk(ctx, f, "requeue", rest, func(id string) (string, error) { return op.requeue(ctx, id) })
	case "delete":
		if err := want(1); err != nil {
			return err
		}
		return op.bulk(ctx, f, "delete", rest, func(id string) (string, error) { return "deleted " + id, op.a.Delete(ctx, id) })
	case "signal":
		if err := want(3); err != nil {
			return err
		}
		if err := op.a.Signal(ctx, rest[0], rest[1], rest[2]); err != nil {
			return err
		}
		_, err := fmt.Fprintf(c.stdout, "signalled %s: %s\n", clean(rest[0]), clean(rest[1]))
		return err
	case "redrive":
		return op.redrive(ctx, f)
	case "move-queue":
		if err := want(1); err != nil {
			return err
		}
		return op.moveQueue(ctx, rest[0], f)
	}
	return op.serve(ctx, f.addr, f)
}

// settings reads the deployment like every function does, with the
// command line's flags over the environment.
func (c *cli) settings(ctx context.Context, cfg aws.Config, f *flags) (settings.Settings, error) {
	over := map[string]string{settings.EnvTable: f.table, settings.EnvQueueURL: f.queue, settings.EnvDLQURL: f.dlq}
	return settings.FromEnv(ctx, cfg, settings.Operator, func(k string) string {
		if v := over[k]; v != "" {
			return v
		}
		return c.getenv(k)
	})
}

// printExports prints shell export lines for the nexjob variables and the
// SDK settings that reach the same backend: the endpoint and, for an
// emulator, its region and dummy credentials (nothing secret of a real
// account is printed).
func (c *cli) printExports(cfg aws.Config, vars map[string]string) {
	if ep := c.getenv("AWS_ENDPOINT_URL"); ep != "" {
		vars["AWS_ENDPOINT_URL"] = ep
		vars["AWS_REGION"] = cfg.Region
		if id := c.getenv("AWS_ACCESS_KEY_ID"); id == "test" || c.getenv("NEXJOB_EMULATOR") != "" {
			vars["AWS_ACCESS_KEY_ID"], vars["AWS_SECRET_ACCESS_KEY"] = "test", "test"
		}
	}
	c.exports(vars)
}

// exports prints vars as shell export lines, sorted.
func (c *cli) exports(vars map[string]string) {
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(c.stdout, "export %s=%s\n", k, shellQuote(vars[k]))
	}
}

// emulator starts the default emulator for a new app's shell: it prints
// the export lines that point the SDK (and so provision, the app's local
// worker and its producer) at it, and stops it at Ctrl-C.
// installEmulator installs the default emulator where a team's tests
// (nexjobtest.Main) look for it, and says where and how long it took.
func (c *cli) installEmulator() error {
	start := time.Now()
	py, err := nexjobtest.InstallEmulator()
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "nexjob: the default emulator (moto %s) is ready: %s (%s)\n", nexjobtest.MotoVersion, py, time.Since(start).Round(100*time.Millisecond))
	return nil
}

func (c *cli) emulator(ctx context.Context) error {
	fmt.Fprintln(c.stderr, "nexjob: starting the default emulator (moto "+nexjobtest.MotoVersion+"; the first run installs it)")
	em, err := nexjobtest.StartEmulator()
	if err != nil {
		return err
	}
	defer em.Stop()
	c.exports(em.Env())
	fmt.Fprintln(c.stderr, "nexjob: paste those lines into another shell; Ctrl-C stops the emulator")
	<-ctx.Done()
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
