// The soak's processes: the worker processes it SIGKILLs and restarts
// (ChildMain, killer) and the workers' duplicating SQS client.

package soak

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/nexjob/nexjob-aws/handler"
	"github.com/nexjob/nexjob-aws/handler/poller"
	"github.com/nexjob/nexjob-aws/internal/proof/faults"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Env variables of a worker process.
const (
	envChild = "NEXJOB_SOAK_CHILD" // the child's seed
	envTable = "NEXJOB_SOAK_TABLE"
	envSteps = "NEXJOB_SOAK_STEPS_TABLE"
	envBlobs = "NEXJOB_SOAK_BLOB_BUCKET"
	envQueue = "NEXJOB_SOAK_QUEUE"
	envBulk  = "NEXJOB_SOAK_BULK"
	envRuns  = "NEXJOB_SOAK_RUNS"
	envRate  = "NEXJOB_SOAK_RATE"
	// envQuiet names a file the killer makes when the faults stop: a
	// worker process that finds it turns its nemesis off.
	envQuiet = "NEXJOB_SOAK_QUIET"
)

// functionTimeout is every soak worker's invocation deadline (the
// pollers' FunctionTimeout), and runLeaseBound the latest a run's lease
// can end after its start: the handler's lease ends 5 s (its leaseSlack)
// past the invocation's deadline.
const (
	functionTimeout = 10 * time.Second
	runLeaseBound   = functionTimeout + 5*time.Second
)

// IsChild reports whether this process is a soak worker process; its
// TestMain then calls ChildMain instead of running tests.
func IsChild() bool { return os.Getenv(envChild) != "" }

// faulty is a config whose clients go through a transport with nemesis n.
func faulty(cfg aws.Config, n *Nemesis) aws.Config {
	t := faults.New(nil)
	t.Nemesis = n.Pick
	return faults.Config(cfg, t)
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// logTo is a Warn-level text logger appending to path (the checker quotes
// a violating job's lines); on error, none.
func logTo(path string) *slog.Logger {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return quietLog()
	}
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// ChildMain is a worker process: the real handler, fed by the local
// poller, under its own nemesis, until it is killed.
func ChildMain() {
	seed, _ := strconv.ParseUint(os.Getenv(envChild), 10, 64)
	rate, _ := strconv.ParseFloat(os.Getenv(envRate), 64)
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	l, err := OpenRunLog(os.Getenv(envRuns))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	n := NewNemesis(seed, rate)
	go quietWhen(os.Getenv(envQuiet), n)
	fc := faulty(cfg, n)
	log := logTo(os.Getenv(envRuns) + ".log")
	env := Env{QueueURL: os.Getenv(envQueue), BulkURL: os.Getenv(envBulk)}
	h, err := handler.New(fc, os.Getenv(envTable), env.QueueURL, Registry(l), &handler.Options{Logger: log, Lease: 20 * time.Second, Queues: env.queues(), GuardAfter: 2 * time.Second,
		Ledger: ledger.Options{StepsTable: os.Getenv(envSteps), BlobBucket: os.Getenv(envBlobs)}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	d := &duplicating{Client: sqs.NewFromConfig(fc), rng: rand.New(rand.NewPCG(seed, 7))}
	var wg sync.WaitGroup
	for _, url := range env.jobQueues() {
		p := poller.New(d, url, h.Handle, &poller.Options{WaitTime: time.Second, FunctionTimeout: functionTimeout, Logger: log})
		wg.Go(func() { _ = p.Run(context.Background()) })
	}
	wg.Wait()
}

// quietWhen turns n off once the file at path exists, and says so with
// a file of its own (path.PID): the quiet period has no faults in the
// worker processes either. They used to fault on through it (their
// nemeses were never turned off), so the jobs left at the end still met
// throttles past the SDK's retries while the checker waited for quiet.
func quietWhen(path string, n *Nemesis) {
	if path == "" {
		return
	}
	for {
		if _, err := os.Stat(path); err == nil {
			n.Off()
			_ = os.WriteFile(path+"."+strconv.Itoa(os.Getpid()), nil, 0o600)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// duplicating is a worker's SQS client that, now and then, sends a copy of
// a received message back to the queue: a delivery SQS makes twice.
type duplicating struct {
	*sqs.Client
	mu     sync.Mutex
	rng    *rand.Rand
	copies atomic.Int64
	down   *atomic.Bool // the outage: receives nothing
}

func (d *duplicating) ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, o ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	if d.down != nil && d.down.Load() {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		return &sqs.ReceiveMessageOutput{}, nil
	}
	out, err := d.Client.ReceiveMessage(ctx, in, o...)
	if err != nil || len(out.Messages) == 0 {
		return out, err
	}
	d.mu.Lock()
	again := d.rng.Float64() < 0.05
	d.mu.Unlock()
	if again {
		m := out.Messages[0]
		if _, err := d.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: in.QueueUrl, MessageBody: m.Body}); err == nil {
			d.copies.Add(1)
		}
	}
	return out, nil
}

// killer runs the worker processes, killing one at random times.
type killer struct {
	c     Config
	env   Env
	rng   *rand.Rand
	rep   *Report
	mu    sync.Mutex
	procs []*exec.Cmd
	kills []kill
	done  atomic.Bool
	all   sync.WaitGroup
}

type kill struct {
	pid int
	at  int64 // unix nanoseconds
}

func newKiller(c Config, env Env, root *rand.Rand, rep *Report) *killer {
	return &killer{c: c, env: env, rng: rand.New(rand.NewPCG(root.Uint64(), 9)), rep: rep}
}

func (k *killer) spawn(i int) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envChild+"="+strconv.FormatUint(k.rng.Uint64(), 10),
		envTable+"="+k.env.Table, envSteps+"="+k.env.StepsTable, envBlobs+"="+k.env.BlobBucket, envQueue+"="+k.env.QueueURL, envBulk+"="+k.env.BulkURL,
		envRuns+"="+filepath.Join(k.c.Dir, fmt.Sprintf("child-%d.runs", i)),
		envRate+"="+strconv.FormatFloat(k.c.FaultRate, 'f', -1, 64),
		envQuiet+"="+k.quietFile())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	k.all.Add(1)
	go func() { defer k.all.Done(); _ = cmd.Wait() }()
	return cmd, nil
}

func (k *killer) run(ctx context.Context) {
	k.mu.Lock()
	for i := range k.c.Children {
		cmd, err := k.spawn(i)
		if err != nil {
			k.mu.Unlock()
			k.c.Logf("soak: start a worker process: %v", err)
			return
		}
		k.procs = append(k.procs, cmd)
	}
	k.mu.Unlock()
	for !k.done.Load() && ctx.Err() == nil && len(k.procs) > 0 {
		k.mu.Lock()
		wait := time.Duration(k.rng.ExpFloat64() * float64(k.c.KillEvery))
		i := k.rng.IntN(len(k.procs))
		k.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if k.done.Load() {
			return
		}
		k.mu.Lock()
		p := k.procs[i]
		if p == nil { // down for the outage
			k.mu.Unlock()
			continue
		}
		_ = p.Process.Signal(syscall.SIGKILL)
		k.kills = append(k.kills, kill{pid: p.Process.Pid, at: time.Now().UnixNano()})
		if cmd, err := k.spawn(i); err == nil {
			k.procs[i] = cmd
		}
		k.mu.Unlock()
	}
}

// outage kills every worker process and holds their restart for d (with
// the in-process workers paused: every worker down at once).
func (k *killer) outage(ctx context.Context, d time.Duration) {
	k.mu.Lock()
	for i, p := range k.procs {
		if p != nil {
			_ = p.Process.Signal(syscall.SIGKILL)
			k.kills = append(k.kills, kill{pid: p.Process.Pid, at: time.Now().UnixNano()})
			k.procs[i] = nil
		}
	}
	k.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, p := range k.procs {
		if p == nil {
			if cmd, err := k.spawn(i); err == nil {
				k.procs[i] = cmd
			}
		}
	}
}

// stop ends the kills and the processes' faults; they keep working
// through the quiet.
func (k *killer) stop() {
	k.done.Store(true)
	if err := os.WriteFile(k.quietFile(), nil, 0o600); err != nil {
		k.c.Logf("soak: the worker processes' faults go on: %v", err)
	}
}

// quietFile is the file whose existence turns the processes' faults off.
func (k *killer) quietFile() string { return filepath.Join(k.c.Dir, "quiet") }

// wait kills the processes left (their runs have ended: the system is
// quiet) and waits for them.
func (k *killer) wait() {
	k.mu.Lock()
	live := 0
	for _, p := range k.procs {
		if p != nil {
			_ = p.Process.Signal(syscall.SIGKILL)
			k.kills = append(k.kills, kill{pid: p.Process.Pid, at: time.Now().UnixNano()})
			live++
		}
	}
	k.mu.Unlock()
	k.all.Wait()
	k.rep.Kills = len(k.killed()) - live
}

func (k *killer) killed() []kill {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]kill(nil), k.kills...)
}

// copies is the duplicate deliveries the processes made: not counted
// (each process keeps its own), reported as 0.
func (k *killer) copies() int { return 0 }
