package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	schedtypes "github.com/aws/aws-sdk-go-v2/service/scheduler/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/internal/kinds"
	"github.com/nexjob/nexjob-aws/ledger"
	"github.com/nexjob/nexjob-aws/provision"
	"github.com/nexjob/nexjob-aws/settings"
)

// ops are the operator's commands over one deployment.
type ops struct {
	*cli
	a   *admin.Admin
	now func() time.Time
}

func newOps(c *cli, s settings.Settings) (*ops, error) {
	a, err := admin.New(s)
	if err != nil {
		return nil, err
	}
	return &ops{cli: c, a: a, now: time.Now}, nil
}

// when reads --since/--until: a duration back from now, or a time.
func (o *ops) when(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return o.now().Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	return time.Time{}, usageError(fmt.Sprintf("--%s %q is neither a duration (24h) nor an RFC 3339 time", flag, v))
}

func (o *ops) filter(f *flags, defaultState ledger.State) (ledger.Filter, error) {
	st := ledger.State(f.state)
	if st == "" {
		st = defaultState
	}
	if !st.Valid() {
		return ledger.Filter{}, usageError(fmt.Sprintf("--state %q is not one of Enqueued, Scheduled, Processing, AwaitingContinuation, Succeeded, Failed, Expired", f.state))
	}
	if f.limit < 0 {
		return ledger.Filter{}, usageError("--limit must be positive")
	}
	since, err := o.when("since", f.since)
	if err != nil {
		return ledger.Filter{}, err
	}
	until, err := o.when("until", f.until)
	if err != nil {
		return ledger.Filter{}, err
	}
	return ledger.Filter{State: st, Kind: f.kind, Since: since, Until: until, Limit: f.limit}, nil
}

func (o *ops) list(ctx context.Context, f *flags) error {
	flt, err := o.filter(f, ledger.Failed)
	if err != nil {
		return err
	}
	max := flt.Limit
	if max == 0 {
		max = 50
	}
	if !o.a.Indexed(flt.State) {
		fmt.Fprintf(o.stderr, "(%s jobs are not indexed: scanning the table)\n", flt.State)
	}
	tw := tabwriter.NewWriter(o.stdout, 0, 0, 2, ' ', 0)
	scheduled := flt.State == ledger.Scheduled // their next run is what an operator asks of them
	if scheduled {
		fmt.Fprintln(tw, "JOB\tKIND\tSTATE\tATTEMPT\tRUNS AT\tCHANGED\tLAST ERROR")
	} else {
		fmt.Fprintln(tw, "JOB\tKIND\tSTATE\tATTEMPT\tCHANGED\tLAST ERROR")
	}
	n := 0
	for n < max {
		flt.Limit = max - n
		recs, next, err := o.a.Find(ctx, flt)
		if err != nil {
			return err
		}
		for _, r := range recs {
			st := string(r.State)
			if r.Cancelled {
				st += " (cancelled)"
			}
			if scheduled {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", clean(r.ID), clean(r.Kind), clean(st), r.Attempt, r.MaxAttempts,
					ledger.Millis(r.RunAt).UTC().Format(time.RFC3339)+" ("+dashboard.Ago(ledger.Millis(r.RunAt), o.now())+")",
					dashboard.Ago(ledger.Millis(r.UpdatedAt), o.now()), oneLine(r.LastError, 70))
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\n", clean(r.ID), clean(r.Kind), clean(st), r.Attempt, r.MaxAttempts,
				dashboard.Ago(ledger.Millis(r.UpdatedAt), o.now()), oneLine(r.LastError, 70))
		}
		n += len(recs)
		if next == "" {
			break
		}
		flt.Cursor = next
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n == 0 {
		fmt.Fprintf(o.stderr, "no %s jobs\n", flt.State)
	}
	return nil
}

// oneLine is s on one line, cut to max runes, made safe to print (clean).
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		s = string(r[:max-1]) + "…"
	}
	return clean(s)
}

// show says what get prints of a job's data: its args, its result, its
// steps' values (none by default: they are the users').
type show struct{ args, result, steps bool }

func (o *ops) get(ctx context.Context, id string, sh show) error {
	showArgs, showResult := sh.args, sh.result
	rec, timeline, err := o.a.Timeline(ctx, id)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(o.stdout, 0, 0, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, clean(v))
		}
	}
	at := func(ms int64) string {
		if ms == 0 {
			return ""
		}
		t := ledger.Millis(ms)
		return t.UTC().Format(time.RFC3339) + " (" + dashboard.Ago(t, o.now()) + ")"
	}
	st := string(rec.State)
	if rec.Cancelled {
		st += " (cancelled by an operator)"
	}
	row("id", rec.ID)
	row("kind", rec.Kind)
	if rec.Queue != "" {
		row("queue", rec.Queue)
	}
	row("state", st)
	// Attempts spent, as the record counts them: a run that ended in a
	// sleep or a wait gave its attempt back, so a sleeping job's logs say
	// attempt=1 (the run's number) while 0 are spent.
	row("attempts", fmt.Sprintf("%d of %d spent", rec.Attempt, rec.MaxAttempts))
	if rec.KeyHash != "" {
		row("key hash", rec.KeyHash+" ("+rec.Policy+")")
	}
	row("created", at(rec.CreatedAt))
	row("changed", at(rec.UpdatedAt))
	if !rec.State.Terminal() {
		row("due", at(rec.RunAt)) // an ended job is due nowhere
	} else {
		row("last run began", at(rec.RunAt)) // an ended job's RunAt (ledger.Finish.Began)
	}
	row("deadline", at(rec.Deadline))
	row("lease until", at(rec.LeaseUntil))
	if rec.ExpiresAt > 0 {
		row("retention ends", at(rec.ExpiresAt*1000))
	}
	row("parent", rec.ParentID)
	if len(rec.Parents) > 0 {
		row("parents", fmt.Sprintf("%s (%d of %d succeeded)", strings.Join(rec.Parents, " "), len(rec.Released), len(rec.Parents)))
	}
	row("continuations", strings.Join(rec.Children, " "))
	row("last error", oneLine(rec.LastError, 400))
	for _, a := range rec.Attempts() {
		row(fmt.Sprintf("run %d", a.N), oneLine(dashboard.RunEnd(rec, a)+" ("+dashboard.Ago(ledger.Millis(a.At), o.now())+")", 300))
	}
	if showArgs {
		row("args", rec.Args)
	} else {
		row("args", fmt.Sprintf("%d bytes (--show-args prints them)", len(rec.Args)))
	}
	switch result := rec.SucceededResult(); {
	case result == "":
	case showResult:
		row("result", result)
	default:
		row("result", fmt.Sprintf("%d bytes (--show-result prints it)", len(result)))
	}
	// The durable timeline: steps, sleeps, waits, signals, children,
	// compensations, in the order written (the record's own, whose times
	// are not kept, last).
	for i, ev := range timeline {
		when := "-"
		if ev.At != 0 {
			when = at(ev.At)
		}
		what := ev.What
		if sh.steps {
			what += " = " + oneLine(strconv.Quote(ev.Value), 200)
		}
		label := ""
		if i == 0 {
			label = "timeline"
		}
		fmt.Fprintf(tw, "%s\t%s  %s\n", label, clean(when), clean(what))
	}
	return tw.Flush()
}

// holder prints the job holding key (get), or says that none does. The
// key itself is never printed: its hash is, as on the job's page.
func (o *ops) holder(ctx context.Context, key string, sh show) error {
	rec, err := o.a.Holder(ctx, key)
	if errors.Is(err, ledger.ErrNotFound) {
		// Not the key's hash: printed for any string, it was the key
		// secret's HMAC of anything a reader chose (issue 38 item 14).
		_, err = fmt.Fprintln(o.stdout, "no job holds the key: an enqueue with it makes a new job")
		return err
	}
	if err != nil {
		return err
	}
	return o.get(ctx, rec.ID, sh)
}

func (o *ops) stats(ctx context.Context) error {
	st, err := o.a.Stats(ctx)
	if err != nil {
		return err
	}
	states := []ledger.State{ledger.Enqueued, ledger.Scheduled, ledger.Processing, ledger.AwaitingContinuation, ledger.Succeeded, ledger.Failed, ledger.Expired}
	kinds := map[string]bool{}
	for _, byKind := range st.Jobs {
		for k := range byKind {
			kinds[k] = true
		}
	}
	var ks []string
	for k := range kinds {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	tw := tabwriter.NewWriter(o.stdout, 0, 0, 2, ' ', 0)
	head := "KIND\t"
	for _, s := range states {
		head += string(s) + "\t"
	}
	fmt.Fprintln(tw, head)
	for _, k := range append(ks, "(all)") {
		line := clean(k) + "\t"
		for _, s := range states {
			n := st.Jobs[s][k]
			if k == "(all)" {
				n = st.Total(s)
			}
			line += fmt.Sprint(n) + "\t"
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	dlq := "none configured"
	if st.DLQ >= 0 {
		dlq = fmt.Sprintf("%d messages", st.DLQ)
	}
	fmt.Fprintf(o.stdout, "\njob queue: %d waiting, %d in flight; dead-letter queue: %s\n", st.Queued, st.InFlight, dlq)
	if len(st.Queues) == 0 {
		return nil
	}
	fmt.Fprintln(o.stdout)
	tw = tabwriter.NewWriter(o.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tWAITING\tIN FLIGHT\tDEAD LETTERS\t")
	for _, q := range st.Queues {
		dlq := "none configured"
		if q.DLQ >= 0 {
			dlq = fmt.Sprint(q.DLQ)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t\n", clean(q.Name), q.Queued, q.InFlight, dlq)
	}
	return tw.Flush()
}

func (o *ops) schedules(ctx context.Context) error {
	list, err := o.a.Schedules(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(o.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RECURRING\tKIND\tEXPRESSION\tCONCURRENCY\tNEXT FIRING")
	for _, s := range list {
		expr := s.Expression
		if s.Timezone != "" {
			expr += " " + s.Timezone
		}
		next := "-"
		switch {
		case !s.Enabled:
			next = "disabled"
		case s.HasNext():
			next = s.Next.UTC().Format(time.RFC3339) + " (" + dashboard.Ago(s.Next, o.now()) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", clean(s.ID), clean(s.Firing.Kind), clean(expr), s.Firing.Concurrency, next)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(list) == 0 {
		fmt.Fprintln(o.stderr, "no recurring jobs")
	}
	return nil
}

// ErrNotLoopback: the dashboard's address is not a loopback one, and
// --allow-remote was not given.
var ErrNotLoopback = errors.New("dashboard: refusing to listen beyond this machine: the dashboard shows every job's args (and, with --write, acts on them) with no login of its own; give a loopback address (127.0.0.1:8080), or --allow-remote behind a proxy that authenticates")

// serve runs the dashboard until ctx ends. An address that is not
// loopback (":8080" is every interface) is refused unless
// --allow-remote; requests must name the address as their Host (or
// localhost on its port, or an --allow-host name).
func (o *ops) serve(ctx context.Context, addr string, f *flags) error {
	write := f.write
	if !loopback(addr) && !f.allowRemote {
		return fmt.Errorf("%w (asked for %q)", ErrNotLoopback, addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("dashboard: %w", err)
	}
	log := slog.New(slog.NewTextHandler(o.stderr, nil))
	if !loopback(addr) {
		log.Warn("nexjob dashboard: listening beyond loopback (--allow-remote): anyone who reaches it reads every job's args", "addr", ln.Addr().String())
	}
	srv := &http.Server{Handler: dashboard.New(o.a, &dashboard.Options{Write: write, Logger: log, Addr: ln.Addr().String(), AllowedHosts: f.allowHosts}), ReadHeaderTimeout: 10 * time.Second}
	mode := "read-only (--write enables requeue, cancel, delete, redrive)"
	if write {
		mode = "write actions on"
	}
	fmt.Fprintf(o.stdout, "dashboard for table %s on http://%s/ (%s); Ctrl-C stops it\n", o.a.Table(), ln.Addr(), mode)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// loopback reports whether addr's host is a loopback IP or localhost
// (an empty host, ":8080", is every interface).
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (c *cli) schema(steps bool) error {
	out, err := provision.TableJSON("nexjob")
	if steps {
		out, err = provision.StepsTableJSON("nexjob-steps")
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(c.stdout, string(out))
	return nil
}

func (c *cli) provision(ctx context.Context, cfg aws.Config, name, queues string, withRecurring bool) error {
	if withRecurring && c.getenv("AWS_ENDPOINT_URL") == "" {
		return usageError("--recurring is for an emulator (AWS_ENDPOINT_URL): on AWS the construct's Recurring prop makes the group, the target function and Scheduler's role")
	}
	var named []string
	for q := range strings.SplitSeq(queues, ",") {
		if q = strings.TrimSpace(q); q == "" {
			continue
		}
		if !kinds.Valid(q) {
			return usageError(fmt.Sprintf("--queues: queue name %q must be %s", q, kinds.Rule))
		}
		named = append(named, q)
	}
	if err := provision.Table(ctx, dynamodb.NewFromConfig(cfg), name); err != nil {
		return err
	}
	if err := provision.StepsTable(ctx, dynamodb.NewFromConfig(cfg), name+"-steps"); err != nil {
		return err
	}
	sq := sqs.NewFromConfig(cfg)
	q, dlq, err := provision.Queues(ctx, sq, provision.QueueSpec{Name: name})
	if err != nil {
		return err
	}
	vars := map[string]string{settings.EnvTable: name, settings.EnvStepsTable: name + "-steps", settings.EnvQueueURL: q, settings.EnvDLQURL: dlq}
	if len(named) > 0 {
		qs := map[string]settings.NamedQueue{}
		for _, n := range named {
			url, dlq, err := provision.Queues(ctx, sq, provision.QueueSpec{Name: name + "-" + n})
			if err != nil {
				return err
			}
			arn, err := provision.QueueARN(ctx, sq, url)
			if err != nil {
				return err
			}
			qs[n] = settings.NamedQueue{URL: url, ARN: arn, DLQURL: dlq}
		}
		b, err := json.Marshal(qs)
		if err != nil {
			return err
		}
		vars[settings.EnvQueues] = string(b)
	}
	if withRecurring {
		group := name + "-recurring"
		_, err := scheduler.NewFromConfig(cfg).CreateScheduleGroup(ctx, &scheduler.CreateScheduleGroupInput{Name: aws.String(group)})
		var conflict *schedtypes.ConflictException
		if err != nil && !errors.As(err, &conflict) {
			return fmt.Errorf("create schedule group %s: %w", group, err)
		}
		// Placeholders: nothing invokes them here, lambdamain.Local fires
		// the group's schedules in-process; Recurring needs both set.
		vars[settings.EnvScheduleGroup] = group
		vars[settings.EnvScheduleTarget] = fmt.Sprintf("arn:aws:lambda:%s:000000000000:function:%s-local", cfg.Region, group)
		vars[settings.EnvSchedulerRole] = fmt.Sprintf("arn:aws:iam::000000000000:role/%s-local", group)
	}
	c.printExports(cfg, vars)
	return nil
}

// errPatchInUse: open jobs still take a patch's old branch.
var errPatchInUse = errors.New("open jobs still take the old branch: keep it")

// patches prints how the open jobs of kind stand on patch name
// (admin.PatchUse) and fails while any lacks it: a deploy that retires
// the old branch waits for 0.
func (o *ops) patches(ctx context.Context, kind, name string) error {
	old, patched, fresh, ids, err := o.a.PatchUse(ctx, kind, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "%d open %s jobs take the old branch of %q, %d the new, %d have not run\n", old, clean(kind), clean(name), patched, fresh)
	for _, id := range ids {
		fmt.Fprintf(o.stdout, "  old: %s\n", id)
	}
	if old > 0 {
		return errPatchInUse
	}
	return nil
}
