package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nexjob/nexjob-aws/enqueue"
	"github.com/nexjob/nexjob-aws/ledger"
)

func loadConfig() (aws.Config, error) { return config.LoadDefaultConfig(context.Background()) }

// result is what one enqueue call (or EnqueueMany item) returned.
type result struct {
	call           string // "enqueue", "many", "continue"
	kind           string
	key            string
	policy         ledger.DuplicatePolicy
	id             string // the job named: created, the duplicate, the rejecting holder, the unsent one
	created        bool
	duplicate      bool
	rejected       *enqueue.DuplicateJobError
	err            error
	parent         string // a continuation's
	cancelled      bool   // the operator cancelled it
	requeued       int    // times the operator's requeue of it succeeded
	requeueUnknown int    // requeues whose outcome was left open
	mayExpire      bool   // its deadline may pass before it starts
	flakyFail      int
	queue          string // the named queue it was sent to
	limited        bool   // refused by its rate limit: known not written
	folded         bool   // a debounced enqueue folded into the pending job id
	rlKey          string // its RateLimit's key
	at, done       time.Time
	firing         string // a recurring firing's scheduled time
	deleted        bool   // the operator deleted it (or may have: its Delete's outcome was left open)
	parents        []string
	flowOf         *result // a flow's continuation: the flow's first job
}

// ledgerOf is what the producers were told.
type ledgerOf struct {
	mu      sync.Mutex
	all     []*result
	results map[string]*result // created jobs by id
	n       int
	signals []signalSent // the Signal calls to Durable jobs
	selects []signalSent // the Signal calls to Invokers' selects (payload: the name's index in SelectNames)
	// misreports are calls that said what did not happen (a Cancel that
	// reported an active job not cancellable).
	misreports []string
}

func (l *ledgerOf) add(r *result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	l.all = append(l.all, r)
	if r.created {
		l.results[r.id] = r
	}
}

// flow counts the calls that used flow control, by feature.
func (l *ledgerOf) flow() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[string]int{}
	for _, r := range l.all {
		switch {
		case r.call == "firing":
			n["firings"]++
		case r.limited:
			n["rate-limited refused"]++
		case r.folded:
			n["debounce folds"]++
		case r.call == "fan-in" && r.created:
			n["fan-in children"]++
		case r.queue != "":
			n["on "+r.queue]++
		case r.kind == (Durable{}).Kind() && r.created:
			n["durable"]++
		case r.kind == (Invoker{}).Kind() && r.created:
			n["invokers"]++
		case r.kind == (Limited{}).Kind() || r.kind == (Throttled{}).Kind() || r.kind == (Keyed{}).Kind():
			n[strings.TrimPrefix(r.kind, "soak.")]++
		}
	}
	for _, s := range l.signals {
		if s.err == nil {
			n["signals"]++
		}
	}
	return n
}

func (l *ledgerOf) calls() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// pick returns a created job id at random (nil rng: none), for
// continuations and cancels.
func (l *ledgerOf) pick(rng *rand.Rand, kind string) *result {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range 8 {
		if len(l.all) == 0 {
			return nil
		}
		r := l.all[rng.IntN(len(l.all))]
		if r.created && r.kind == kind {
			return r
		}
	}
	return nil
}

// pickParent returns a created job some continuation names as its parent
// (nil: none yet).
func (l *ledgerOf) pickParent(rng *rand.Rand) *result {
	l.mu.Lock()
	defer l.mu.Unlock()
	var parents []string
	for _, r := range l.all {
		if r.call == "continue" && r.created && r.parent != "" {
			parents = append(parents, r.parent)
		}
	}
	if len(parents) == 0 {
		return nil
	}
	return l.results[parents[rng.IntN(len(parents))]]
}

// producer enqueues its share of the mix.
type producer struct {
	c    *enqueue.Client
	db   *dynamodb.Client // for EnqueueTx's commit, through the producer's nemesis
	rng  *rand.Rand
	led  *ledgerOf
	keys int // the shared key pool's size: racing producers collide on purpose
	id   int
	seq  int
	bulk bool // the named queue Bulk is there
	// signals are the Signal calls still to be made to Durable jobs.
	signals sync.WaitGroup
}

var policies = []ledger.DuplicatePolicy{ledger.AllowAfterFailed, ledger.RejectIfFailed, ledger.RejectAlways}

func (p *producer) args(kind string) (enqueue.JobArgs, int) {
	p.seq++
	n := p.id*1_000_000 + p.seq
	switch kind {
	case "soak.flaky":
		f := 1 + p.rng.IntN(2)
		return Flaky{N: n, Fails: f}, f
	case "soak.doomed":
		return Doomed{N: n}, 0
	case "soak.slow":
		return Slow{N: n}, 0
	case "soak.limited":
		return Limited{N: n, Tenant: fmt.Sprintf("t%d", p.rng.IntN(3))}, 0
	case "soak.throttled":
		return Throttled{N: n, Tenant: fmt.Sprintf("t%d", p.rng.IntN(3))}, 0
	case "soak.keyed":
		return Keyed{N: n, Tenant: fmt.Sprintf("t%d", p.rng.IntN(3))}, 0
	}
	return OK{N: n}, 0
}

func (p *producer) run(ctx context.Context, n int) {
	defer p.signals.Wait()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		x := p.rng.Float64()
		switch {
		case x < 0.40: // keyed, from the shared pool, any policy: re-used keys and races
			key := fmt.Sprintf("shared-%d", p.rng.IntN(p.keys))
			kind := []string{"soak.ok", "soak.ok", "soak.doomed", "soak.flaky"}[p.rng.IntN(4)]
			p.one(ctx, kind, &enqueue.Opts{IdempotencyKey: key, DuplicatePolicy: policies[p.rng.IntN(3)], MaxAttempts: 3})
		case x < 0.42: // durable: a step, a sleep, a signal and a result
			p.durable(ctx)
		case x < 0.44: // a job that starts children, awaits them all, and compensates when one failed
			p.invoker(ctx)
		case x < 0.46: // a key function that panics for some (a team's bug): those fail, never run
			p.one(ctx, "soak.keyed", &enqueue.Opts{MaxAttempts: 2})
		case x < 0.50 && p.bulk: // on the named queue: a doomed or flaky job's retries and hook stay there
			kind := []string{"soak.ok", "soak.flaky", "soak.doomed"}[p.rng.IntN(3)]
			p.one(ctx, kind, &enqueue.Opts{Queue: Bulk, MaxAttempts: 3})
		case x < 0.52:
			p.one(ctx, "soak.limited", &enqueue.Opts{MaxAttempts: 3})
		case x < 0.54:
			p.one(ctx, "soak.throttled", &enqueue.Opts{MaxAttempts: 3})
		case x < 0.55: // a burst of 3 rate-limited at 2 a second per key: the third is refused, nothing written
			o := &enqueue.Opts{RateLimit: &enqueue.RateLimit{Key: fmt.Sprintf("rl-%d", p.rng.IntN(2)), Limit: RateLimitLimit, Period: RateLimitPeriod}}
			for range 3 {
				p.one(ctx, "soak.ok", o)
			}
		case x < 0.63:
			p.one(ctx, "soak.flaky", &enqueue.Opts{IdempotencyKey: fmt.Sprintf("flaky-%d-%d", p.id, i), MaxAttempts: 4})
		case x < 0.70:
			p.one(ctx, "soak.doomed", &enqueue.Opts{MaxAttempts: 2})
		case x < 0.75:
			p.one(ctx, "soak.slow", &enqueue.Opts{MaxAttempts: 3})
		case x < 0.82: // a few seconds ahead
			p.one(ctx, "soak.ok", &enqueue.Opts{Delay: time.Duration(1+p.rng.IntN(3)) * time.Second})
		case x < 0.85: // on the shared keys, with a deadline just after its run time: most expire
			runAt := time.Now().Add(time.Second)
			p.one(ctx, "soak.ok", &enqueue.Opts{IdempotencyKey: fmt.Sprintf("shared-%d", p.rng.IntN(p.keys)), DuplicatePolicy: policies[p.rng.IntN(3)],
				RunAt: runAt, Deadline: runAt.Add(50 * time.Millisecond)})
		case x < 0.89:
			p.child(ctx)
		case x < 0.90:
			p.fanIn(ctx)
		case x < 0.91: // a burst of debounced enqueues on a small key pool: they fold into one pending job
			o := &enqueue.Opts{Debounce: &enqueue.Debounce{Key: fmt.Sprintf("db-%d", p.rng.IntN(4)), Period: time.Second, MaxWait: 3 * time.Second}}
			for range 3 {
				p.one(ctx, "soak.ok", o)
			}
		case x < 0.935:
			p.tx(ctx)
		case x < 0.95:
			p.flow(ctx)
		default:
			p.many(ctx)
		}
	}
}

func (p *producer) one(ctx context.Context, kind string, o *enqueue.Opts) {
	a, fails := p.args(kind)
	r := &result{call: "enqueue", kind: kind, flakyFail: fails}
	if o != nil {
		r.key, r.policy, r.queue = o.IdempotencyKey, o.DuplicatePolicy, o.Queue
	}
	if o != nil && o.RateLimit != nil {
		r.rlKey = o.RateLimit.Key
	}
	if o != nil && !o.Deadline.IsZero() {
		r.mayExpire = true
	}
	r.at = time.Now()
	res, err := p.c.Enqueue(ctx, a, o)
	r.done = time.Now()
	p.led.add(record(r, res, err))
}

// invoker enqueues an Invoker job of 1 to 4 children, one in five of
// them failing, the children's names ending in one of DurableSuffixes;
// one in eight records a hundred steps first.
func (p *producer) invoker(ctx context.Context) {
	p.seq++
	a := Invoker{N: p.id*1_000_000 + p.seq, Kids: 1 + p.rng.IntN(4), Sfx: DurableSuffixes[p.rng.IntN(len(DurableSuffixes))]}
	if p.rng.IntN(8) == 0 {
		a.Steps = 100 // a hundred steps before its map and children
	}
	a.Big = p.rng.IntN(8) == 0
	a.Select = p.rng.IntN(3) == 0
	a.Cond = p.rng.IntN(3) == 0
	send := p.rng.IntN(4) // the select's signals: none, "go", "stop", both
	after := time.Duration(p.rng.IntN(2000)) * time.Millisecond
	for i := range a.Kids {
		if p.rng.IntN(5) == 0 {
			a.Fail = append(a.Fail, i)
		}
	}
	r := &result{call: "enqueue", kind: a.Kind()}
	r.at = time.Now()
	// Ten attempts: a hundred steps' writes under the fault rate, and
	// kills spending attempts (seed 1796624232777544508: two kills, then
	// a throttle past the retries at attempt 4 of 4 failed one).
	res, err := p.c.Enqueue(ctx, a, &enqueue.Opts{MaxAttempts: 10})
	r.done = time.Now()
	p.led.add(record(r, res, err))
	if !a.Select || !r.created || send == 0 {
		return
	}
	p.signals.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(after):
		}
		for i := range SelectNames {
			if send&(1<<i) == 0 {
				continue
			}
			err := p.c.Signal(ctx, r.id, SelectNames[i]+a.Sfx, i)
			p.led.mu.Lock()
			p.led.selects = append(p.led.selects, signalSent{id: r.id, payload: i, err: err})
			p.led.mu.Unlock()
		}
	})
}

// durable enqueues a Durable job and signals it 0 to 3 s later, from
// its own goroutine: before its wait began, during it, or (a signal call
// that failed) never, and it times out.
//
// Its names end in one of DurableSuffixes. One in four has a Deadline
// a second on (it may expire unrun, never once it ran: its sleep and wait
// pass the deadline); one in five is debounced on a small key pool (a
// fold joins only a job that never ran); one in fifty waits two years
// (refused: it fails at once); one in four is also sent two 16 KB
// signals no wait asks for, before or during its run (they never take
// its steps' room).
func (p *producer) durable(ctx context.Context) {
	p.seq++
	n := p.id*1_000_000 + p.seq
	a := Durable{N: n, Fails: p.rng.IntN(2), NapMs: 300 + p.rng.IntN(1700), Sfx: DurableSuffixes[p.rng.IntN(len(DurableSuffixes))]}
	if p.rng.IntN(50) == 0 {
		a.WaitMs = (2 * 365 * 24 * time.Hour).Milliseconds()
	}
	o := &enqueue.Opts{MaxAttempts: 4}
	r := &result{call: "enqueue", kind: a.Kind(), flakyFail: a.Fails}
	switch p.rng.IntN(20) {
	case 0, 1, 2, 3, 4:
		o.Deadline, r.mayExpire = time.Now().Add(time.Second), true // past the producer clock's 300 ms lead
	case 5, 6, 7, 8:
		k := p.rng.IntN(3)
		o.Debounce = &enqueue.Debounce{Key: fmt.Sprintf("ddb-%d", k), Period: time.Second}
		a.Sfx = DurableSuffixes[k] // one per key: a fold's signal names the wait the job will make
	}
	junk := p.rng.IntN(4) == 0
	r.at = time.Now()
	res, err := p.c.Enqueue(ctx, a, o)
	r.done = time.Now()
	p.led.add(record(r, res, err))
	if !r.created && !r.folded {
		return
	}
	after := time.Duration(p.rng.IntN(3000)) * time.Millisecond
	p.signals.Go(func() {
		if junk {
			payload := strconv.Quote(strings.Repeat("j", ledger.MaxStepBytes-2))
			for i := range 2 {
				_ = p.c.Signal(ctx, r.id, fmt.Sprintf("junk-%d", i), json.RawMessage(payload)) // refused or kept: either way, never the job's room
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(after):
		}
		err := p.c.Signal(ctx, r.id, "go"+a.Sfx, n)
		p.led.mu.Lock()
		p.led.signals = append(p.led.signals, signalSent{id: r.id, payload: n, err: err})
		p.led.mu.Unlock()
	})
}

// tx enqueues in a transaction of the producer's own (EnqueueTx, the
// commit, Settle).
func (p *producer) tx(ctx context.Context) {
	a, _ := p.args("soak.ok")
	r := &result{call: "tx", kind: "soak.ok", key: fmt.Sprintf("tx-%d-%d", p.id, p.seq)}
	tx, err := p.c.EnqueueTx(ctx, a, &enqueue.Opts{IdempotencyKey: r.key})
	if err != nil {
		p.led.add(record(r, enqueue.Result{}, err))
		return
	}
	var commitErr error
	if len(tx.Items) > 0 {
		_, commitErr = p.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: tx.Items})
	}
	res, err := p.c.Settle(ctx, tx, commitErr)
	var unknown *enqueue.TxUnknownError
	for range 3 {
		if !errors.As(err, &unknown) {
			break
		}
		res, err = p.c.Settle(ctx, tx, commitErr) // as its doc says: settle again
	}
	if errors.Is(err, enqueue.ErrTxNotCommitted) {
		p.led.add(r) // not created, and known not to be: no job, no open outcome
		return
	}
	p.led.add(record(r, res, err))
}

// flow enqueues a flow (EnqueueFlow): a keyed first job, ok or doomed,
// then two ok jobs and a fan-in over them. Each job is a result of its
// own (call "flow"), its parents named; flowOf links them for checkFlows.
func (p *producer) flow(ctx context.Context) {
	p.seq++
	kind := []string{"soak.ok", "soak.ok", "soak.doomed"}[p.rng.IntN(3)]
	a, _ := p.args(kind)
	key := fmt.Sprintf("flow-%d-%d", p.id, p.seq)
	mk := func() enqueue.Flow { b, _ := p.args("soak.ok"); return enqueue.Flow{Args: b} }
	f := enqueue.Flow{Args: a, Opts: &enqueue.Opts{IdempotencyKey: key, MaxAttempts: 2}, Then: []enqueue.Flow{mk(), mk()}, Join: ptr(mk())}
	at := time.Now()
	res, err := p.c.EnqueueFlow(ctx, f)
	root := record(&result{call: "flow", kind: kind, key: key, at: at, done: time.Now()}, res.Result, err)
	p.led.add(root)
	made := root.created && len(res.Then) == 2 && res.Join != nil
	members := []struct {
		id      string
		parents []string
	}{{"", []string{root.id}}, {"", []string{root.id}}, {"", nil}}
	if made {
		members[0].id, members[1].id, members[2].id = res.Then[0].ID, res.Then[1].ID, res.Join.ID
		members[2].parents = []string{res.Then[0].ID, res.Then[1].ID}
	}
	for _, m := range members {
		r := &result{call: "flow", kind: "soak.ok", id: m.id, created: made, parents: m.parents, flowOf: root, err: err}
		if !made && !root.duplicate && (err == nil || errors.Is(err, enqueue.ErrTxNotCommitted)) {
			r.err = nil // known: nothing of it was written
		}
		p.led.add(r)
	}
}

func ptr[T any](v T) *T { return &v }

func (p *producer) child(ctx context.Context) {
	parent := p.led.pick(p.rng, "soak.ok")
	if parent == nil {
		p.one(ctx, "soak.ok", nil)
		return
	}
	a, _ := p.args("soak.ok")
	r := &result{call: "continue", kind: "soak.ok", parent: parent.id, parents: []string{parent.id}}
	res, err := p.c.ContinueWith(ctx, parent.id, a, nil)
	p.led.add(record(r, res, err))
}

// fanIn continues two created soak.ok jobs with one child
// (ContinueWhenAll).
func (p *producer) fanIn(ctx context.Context) {
	a, b := p.led.pick(p.rng, "soak.ok"), p.led.pick(p.rng, "soak.ok")
	if a == nil || b == nil || a.id == b.id {
		p.one(ctx, "soak.ok", nil)
		return
	}
	args, _ := p.args("soak.ok")
	r := &result{call: "fan-in", kind: "soak.ok", parents: []string{a.id, b.id}}
	res, err := p.c.ContinueWhenAll(ctx, []string{a.id, b.id}, args, nil)
	p.led.add(record(r, res, err))
}

func (p *producer) many(ctx context.Context) {
	items := make([]enqueue.Item, 3)
	for i := range items {
		a, _ := p.args("soak.ok")
		items[i] = enqueue.Item{Args: a, Opts: &enqueue.Opts{IdempotencyKey: fmt.Sprintf("many-%d-%d-%d", p.id, p.seq, i)}}
	}
	out, _ := p.c.EnqueueMany(ctx, items)
	for i, it := range out {
		r := &result{call: "many", kind: "soak.ok", key: items[i].Opts.IdempotencyKey}
		res := it.Result
		if !it.Recorded && it.Err == nil {
			it.Err = errors.New("not recorded")
		}
		p.led.add(record(r, res, it.Err))
	}
}

// record fills r from an enqueue's outcome.
func record(r *result, res enqueue.Result, err error) *result {
	r.err = err
	var dup *enqueue.DuplicateJobError
	var de *enqueue.DispatchError
	var rl *enqueue.RateLimitedError
	switch {
	case errors.As(err, &rl):
		r.limited = true
	case err == nil && res.Folded:
		r.id, r.folded = res.ID, true // into a job an earlier call created
	case err == nil:
		r.id, r.duplicate, r.created = res.ID, res.Duplicate, !res.Duplicate
	case errors.As(err, &dup):
		r.rejected, r.id = dup, dup.ExistingJobID
	case errors.As(err, &de):
		// Recorded, not sent: the guard (or a retry of its key) sends it.
		// The job this call created, or the holder it met and sent again
		// (a late firing's retry that got the next firing's unsent job
		// back read as a second job of its firing: the 10k soak, seed
		// 1796517429524512631, "the firing at … made 2 jobs").
		r.id, r.duplicate, r.created = de.JobID, res.Duplicate, !res.Duplicate
	}
	return r
}

// operate cancels jobs, requeues Failed doomed ones and deletes parents
// of continuations now and then, as an operator would. A requeue whose
// outcome is left open counts in requeueUnknown; a Delete tried marks the
// job deleted whatever its outcome (its record may be gone). Each requeue
// and its outcome is logged (operator.log), for a violation's history.
func operate(ctx context.Context, c *enqueue.Client, log *slog.Logger, led *ledgerOf, rng *rand.Rand) {
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(100+rng.IntN(300)) * time.Millisecond):
		}
		if rng.IntN(8) == 0 {
			// Delete a job some continuation was made of: its waiting
			// children must end (or be released), never wait for ever.
			r := led.pickParent(rng)
			if r == nil {
				continue
			}
			led.mu.Lock()
			r.deleted = true
			led.mu.Unlock()
			_ = c.Delete(ctx, r.id)
			continue
		}
		if rng.IntN(2) == 0 {
			// A plain job, or a durable one: in its sleep or its wait, or
			// running (asked to stop at its next step).
			r := led.pick(rng, []string{"soak.ok", "soak.durable"}[rng.IntN(2)])
			if r == nil {
				continue
			}
			_, err := c.Cancel(ctx, r.id, "soak: cancelled", 0)
			var nc *enqueue.NotCancellableError
			led.mu.Lock()
			switch {
			case err == nil:
				r.cancelled = true
			case errors.As(err, &nc) && (nc.State == ledger.Enqueued || nc.State == ledger.Scheduled):
				// Cancel says it cannot cancel a job it cancels (it
				// withdraws Enqueued and Scheduled ones; a continuation
				// waiting for its parent is not its to cancel): it lost a
				// race with the job's run (issue 38 item 6).
				led.misreports = append(led.misreports, fmt.Sprintf("job %s: Cancel reported %v", r.id, err))
			}
			led.mu.Unlock()
			continue
		}
		r := led.pick(rng, "soak.doomed")
		if r == nil {
			continue
		}
		_, err := c.RequeueFrom(ctx, r.id, ledger.Failed)
		log.InfoContext(ctx, "soak: requeue", "job_id", r.id, "err", err)
		led.mu.Lock()
		var sc *enqueue.StateChangedError
		var nf = errors.Is(err, ledger.ErrNotFound)
		switch {
		case err == nil:
			r.requeued++
		case errors.As(err, &sc) || nf:
		default:
			r.requeueUnknown++
		}
		led.mu.Unlock()
	}
}
