// Package lambdamain starts nexjob's Lambda functions: one call is a
// team's whole main.
//
//	func main() {
//		lambdamain.Serve(orders.Registry(), nil) // the team's kinds, with their hooks
//	}
//
// Serve picks the function's role from NEXJOB_ROLE (worker, deadletter,
// guard, dashboard, recurring or events), so one binary can serve them all;
// Worker, DeadLetter, Guard, Dashboard, Recurring and Events start one role each. Every role reads its configuration through
// settings.Load: the same variables the CDK construct sets on every
// function and that producers and the CLI read.
//
// # How it fails
//
// A bad configuration (a missing variable, one that does not parse, no
// AWS region, an unreadable key secret) stops the function at start with
// one JSON log line naming the variable, and exit status 1: the
// invocation fails at init, visibly, instead of at the first job. Logs
// are JSON on stdout (the Lambda log format) at Info, unless
// Options.Logger says otherwise; they carry job ids and kinds, never args
// or keys.
package lambdamain

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdaurl"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/nexjob/nexjob-aws/admin"
	"github.com/nexjob/nexjob-aws/dashboard"
	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/completion"
	"github.com/nexjob/nexjob-aws/handler/guard"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/metrics"
	"github.com/nexjob/nexjob-aws/recurring"
	"github.com/nexjob/nexjob-aws/settings"
)

// Options tune the functions. The zero value (or nil) takes every default.
type Options struct {
	// Handler is the base of the worker's and DLQ consumer's options
	// (concurrency, hooks, backoff for unknown kinds, …); the settings
	// fill in the DLQ URL, the retention and the ledger's options.
	Handler *handler.Options
	// Logger defaults to JSON on stdout, durations written as text
	// ("10s"); Local's to text lines.
	Logger *slog.Logger
	// Start replaces lambda.Start (tests call the handler instead).
	Start func(handler any)
}

// Serve starts the role NEXJOB_ROLE names. It does not return.
func Serve(reg *handler.Registry, opts *Options) {
	switch r := settings.Role(os.Getenv(settings.EnvRole)); r {
	case settings.Worker:
		Worker(reg, opts)
	case settings.DeadLetter:
		DeadLetter(reg, opts)
	case settings.Guard:
		Guard(opts)
	case settings.Dashboard:
		Dashboard(opts)
	case settings.Recurring:
		Recurring(opts)
	case settings.Events:
		Events(opts)
	default:
		fail(logger(opts, r), &settings.InvalidError{Var: settings.EnvRole, Reason: "want worker, deadletter, guard, dashboard, recurring or events"})
	}
}

// Worker starts the function fed by the job queue (handler.Handle). reg
// holds the kinds it runs. It does not return.
func Worker(reg *handler.Registry, opts *Options) {
	h, log := build(reg, settings.Worker, opts)
	start(opts, log, h.Handle)
}

// DeadLetter starts the function fed by the DLQ (handler.HandleDeadLetters).
// reg must hold the same kinds as the worker's, for their dead-letter
// hooks. It does not return.
func DeadLetter(reg *handler.Registry, opts *Options) {
	h, log := build(reg, settings.DeadLetter, opts)
	start(opts, log, h.HandleDeadLetters)
}

// Guard starts the dispatch guard, fed by the table's stream. It does not
// return.
func Guard(opts *Options) {
	log := logger(opts, settings.Guard)
	s, err := settings.Load(context.Background(), settings.Guard)
	if err != nil {
		fail(log, err)
	}
	g := guard.New(sqs.NewFromConfig(s.AWS), s.QueueURL, &guard.Options{After: s.GuardAfter, Logger: log, Far: s.FarScheduler(), Queues: s.QueueURLs()})
	start(opts, log, g.HandleStream)
}

// Events starts the completion events' publisher, fed by the table's
// stream (the construct's CompletionEvents prop). It does not return.
func Events(opts *Options) {
	log := logger(opts, settings.Events)
	s, err := settings.Load(context.Background(), settings.Events)
	if err != nil {
		fail(log, err)
	}
	p := completion.New(eventbridge.NewFromConfig(s.AWS), &completion.Options{Bus: s.EventBus, Logger: log})
	start(opts, log, p.HandleStream)
}

// Dashboard starts the web dashboard behind a Lambda function URL (the
// construct's Dashboard prop: IAM auth, response streaming). Write
// actions are on only with NEXJOB_DASHBOARD_WRITE=true. It does not
// return.
func Dashboard(opts *Options) {
	log := logger(opts, settings.Dashboard)
	s, err := settings.Load(context.Background(), settings.Dashboard)
	if err != nil {
		fail(log, err)
	}
	a, err := admin.New(s)
	if err != nil {
		fail(log, err)
	}
	// The function URL's own domain is the only Host it answers: IAM auth
	// already fronts it; the check is the same as on a laptop.
	hosts := []string{".lambda-url." + s.AWS.Region + ".on.aws"}
	start(opts, log, lambdaurl.Wrap(dashboard.New(a, &dashboard.Options{Write: s.DashboardWrite, Logger: log, AllowedHosts: hosts})))
}

// Recurring starts the EventBridge Scheduler target of recurring jobs
// (package recurring): each invocation enqueues one firing. A firing that
// fails returns its error, and Scheduler retries it. It does not return.
func Recurring(opts *Options) {
	log := logger(opts, settings.Recurring)
	s, err := settings.Load(context.Background(), settings.Recurring)
	if err != nil {
		fail(log, err)
	}
	o := s.ClientOptions()
	o.Logger = log
	if o.Metrics == nil {
		o.Metrics = metrics.New(nil)
	}
	c, err := enqueue.New(s.AWS, s.Table, s.QueueURL, o)
	if err != nil {
		fail(log, err)
	}
	start(opts, log, func(ctx context.Context, f recurring.Firing) (enqueue.Result, error) {
		return recurring.Fire(ctx, c, f)
	})
}

// NewHandler builds the handler a role's function runs, from the
// environment: what Worker and DeadLetter start, for a team's own main
// or test.
func NewHandler(ctx context.Context, reg *handler.Registry, role settings.Role, opts *Options) (*handler.Handler, error) {
	s, err := settings.Load(ctx, role)
	if err != nil {
		return nil, err
	}
	return handlerOf(s, reg, role, opts)
}

func handlerOf(s settings.Settings, reg *handler.Registry, role settings.Role, opts *Options) (*handler.Handler, error) {
	return handler.New(s.AWS, s.Table, s.QueueURL, reg, handlerOptions(s, role, opts, logger(opts, role), true))
}

// handlerOptions are the handler's options from the settings and opts,
// logging to log unless opts name a logger. emf: metrics default to EMF
// lines on stdout (CloudWatch metrics, no API call); else to none.
func handlerOptions(s settings.Settings, role settings.Role, opts *Options, log *slog.Logger, emf bool) *handler.Options {
	var base *handler.Options
	if opts != nil {
		base = opts.Handler
	}
	o := s.HandlerOptions(base)
	if o.Logger == nil {
		o.Logger = log
	}
	if o.Metrics == nil && emf {
		o.Metrics = metrics.New(nil)
	}
	return o
}

func build(reg *handler.Registry, role settings.Role, opts *Options) (*handler.Handler, *slog.Logger) {
	log := logger(opts, role)
	h, err := NewHandler(context.Background(), reg, role, opts)
	if err != nil {
		fail(log, err)
	}
	return h, log
}

func logger(opts *Options, role settings.Role) *slog.Logger {
	if opts != nil && opts.Logger != nil {
		return opts.Logger
	}
	return slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{ReplaceAttr: durationText})).With("function", string(role))
}

// localLogger is Local's default: text lines for people, on stdout.
func localLogger(opts *Options) *slog.Logger {
	if opts != nil && opts.Logger != nil {
		return opts.Logger
	}
	return slog.New(slog.NewTextHandler(stdout, &slog.HandlerOptions{ReplaceAttr: durationText}))
}

// stdout is where the default loggers write (a test's buffer in tests).
var stdout io.Writer = os.Stdout

// durationText writes a duration as one ("10s", "1.5ms"): slog's JSON
// handler writes integer nanoseconds ("retry_in":10000000000).
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

func start(opts *Options, log *slog.Logger, h any) {
	// A hook's or a worker's slog.Default() writes as the library does:
	// one format in the function's log stream.
	slog.SetDefault(log)
	if opts != nil && opts.Start != nil {
		opts.Start(h)
		return
	}
	log.Info("nexjob: function starting")
	lambda.Start(h)
}

func fail(log *slog.Logger, err error) {
	log.Error("nexjob: bad configuration", "err", err)
	os.Exit(1)
}

// Local runs reg on this machine until ctx is done: the worker on the job
// queue and the DLQ consumer on the dead-letter queue (when
// NEXJOB_DLQ_URL names one), each fed by the local poller (package
// handler/poller) as Lambda's event source mappings feed them on AWS,
// with the same handler and the same settings (package settings:
// NEXJOB_TABLE, NEXJOB_QUEUE_URL, …; AWS_ENDPOINT_URL for the emulator or
// LocalStack), and every named queue NEXJOB_QUEUES names with its DLQ,
// each polled on its own (a queue it cannot reach is an error at start).
// It is Asynq's srv.Run, River's client.Start:
//
//	func main() {
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
//		err := lambdamain.Local(ctx, orders.Registry(), nil)
//		stop() // before log.Fatal, which runs no deferred call
//		if err != nil {
//			log.Fatal(err)
//		}
//	}
//
// The dispatch guard, fed by the table's stream on AWS, does not run
// here: a job whose producer died between its write and its send is sent
// when a caller retries its key. Never point Local at queues a deployed
// function consumes. It returns a bad configuration's error at once, and
// nil when ctx ends (after the batches in hand are handled).
//
// It logs for people: text lines on stdout (Options.Logger to change it),
// durations as durations ("retry_in=10s"), and no EMF metric lines
// (Options.Handler.Metrics to have them), where a Lambda function writes
// JSON and EMF on one stream for CloudWatch.
func Local(ctx context.Context, reg *handler.Registry, opts *Options) error {
	s, err := settings.Load(ctx, settings.Worker)
	if err != nil {
		return err
	}
	log := localLogger(opts)
	h, err := handler.New(s.AWS, s.Table, s.QueueURL, reg, handlerOptions(s, settings.Worker, opts, log, false))
	if err != nil {
		return err
	}
	q := sqs.NewFromConfig(s.AWS)
	var wg sync.WaitGroup
	run := func(url string, fn poller.HandlerFunc) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = poller.New(q, url, fn, &poller.Options{Logger: log}).Run(ctx)
		}()
	}
	// Every queue the settings name, the named ones (NEXJOB_QUEUES) and
	// their DLQs too, each with its own poller: a queue this process
	// cannot reach is an error now, not jobs left Enqueued on it.
	urls := []string{s.QueueURL}
	dlqs := []string{}
	if s.DLQURL != "" {
		dlqs = append(dlqs, s.DLQURL)
	}
	names := slices.Sorted(maps.Keys(s.Queues))
	for _, name := range names {
		urls = append(urls, s.Queues[name].URL)
		if d := s.Queues[name].DLQURL; d != "" {
			dlqs = append(dlqs, d)
		}
	}
	for _, url := range append(slices.Clone(urls), dlqs...) {
		if _, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}}); err != nil {
			return fmt.Errorf("nexjob: queue %s cannot be reached (create it: nexjob provision NAME --queues …): %w", url, err)
		}
	}
	for _, url := range urls {
		run(url, h.Handle)
	}
	for _, url := range dlqs {
		run(url, h.HandleDeadLetters)
	}
	group := ""
	if os.Getenv(settings.EnvScheduleGroup) != "" {
		// The deployment's recurring jobs fire here too, as Scheduler
		// fires them on AWS (its local emulation keeps schedules and
		// fires nothing).
		group = s.Schedules.Group
		rc := recurring.New(s.AWS, s.Schedules)
		wg.Go(func() { fireRecurring(ctx, rc, h.Producer(), log) })
	}
	log.InfoContext(ctx, "nexjob: running locally", "table", s.Table, "queue", s.QueueURL, "dlq", s.DLQURL, "named_queues", names, "schedule_group", group)
	wg.Wait()
	return nil
}

// fireRecurring plays EventBridge Scheduler for the recurring jobs of
// rc's group until ctx ends: every second it reads the schedules (List)
// and fires each enabled one's firings that came due since Local started
// (recurring.Next: the same cron, rate and time-zone rules), in order,
// each through recurring.Fire with its scheduled time, so one firing
// makes one run under the same keys as on AWS. Time is the client's
// ledger clock (a test's kit clock moves it). A failed List or Fire is
// logged and tried again the next second, from the same firing.
func fireRecurring(ctx context.Context, rc *recurring.Client, c *enqueue.Client, log *slog.Logger) {
	now := c.Store().Now
	started := now()
	from := map[string]time.Time{} // schedule id → its last firing (or the start)
	for ctx.Err() == nil {
		scheds, err := rc.List(ctx)
		if err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, "nexjob: reading the recurring schedules failed", "err", err)
		}
		for _, sc := range scheds {
			last, seen := from[sc.ID]
			if !seen {
				last = started
			}
			for range 1000 { // a clock moved far ahead fires what it passed, within reason
				at, ok := sc.NextFiring(last)
				if !ok || at.After(now()) {
					break
				}
				f := sc.Firing
				f.ScheduledTime = at.UTC().Format(time.RFC3339)
				if _, err := recurring.Fire(ctx, c, f); err != nil {
					log.WarnContext(ctx, "nexjob: a recurring firing failed; it is tried again", "schedule", sc.ID, "at", f.ScheduledTime, "err", err)
					break
				}
				last = at
			}
			from[sc.ID] = last
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
