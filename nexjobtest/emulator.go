package nexjobtest

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MotoVersion is the moto release the default emulator runs.
const MotoVersion = "5.2.5"

//go:embed emulator.py
var emulatorPy []byte

// requirements pins moto and every package it needs, each with its
// hashes: pip installs nothing else (--require-hashes).
//
//go:embed requirements.txt
var requirements []byte

// Main runs the test binary's tests against the default emulator, started
// here when no backend is configured, and returns the exit code:
//
//	func TestMain(m *testing.M) { os.Exit(nexjobtest.Main(m)) }
//
// The emulator is shared by the test binaries of this user on this
// machine (SharedEmulator: the first starts it, the others find it, it
// ends itself after SharedIdle without a request), so go test ./... of a
// module of eight packages pays one start, not eight; NEXJOB_EMULATOR=
// per-package gives each binary its own, stopped when it ends. With
// AWS_ENDPOINT_URL set (an emulator already running, LocalStack) it
// starts none and uses that one.
//
// With NEXJOB_NO_EMULATOR=1 (make check, the fast loop) it starts none,
// and every test that needs AWS skips (Config); under CI=true such a test
// fails instead, so a CI run never passes by skipping.
func Main(m *testing.M) int {
	if os.Getenv("AWS_ENDPOINT_URL") != "" || os.Getenv("NEXJOB_REAL_AWS") == "1" || os.Getenv(EnvNoEmulator) == "1" {
		return m.Run()
	}
	var em *Emulator
	var err error
	if os.Getenv(EnvEmulator) != "per-package" {
		em, err = SharedEmulator()
		if err != nil {
			notice("nexjobtest: no shared emulator (" + err.Error() + "); this package starts its own")
		}
	}
	if em == nil {
		if em, err = StartEmulator(); err != nil {
			fmt.Fprintln(os.Stderr, "nexjobtest:", err)
			return 1
		}
	}
	defer em.Stop()
	for k, v := range em.Env() {
		_ = os.Setenv(k, v)
	}
	return m.Run()
}

// EnvNoEmulator set to 1 keeps Main from starting the emulator.
const EnvNoEmulator = "NEXJOB_NO_EMULATOR"

// EnvEmulator set to per-package makes Main start an emulator of the test
// binary's own, stopped when it ends, instead of the shared one
// (SharedEmulator).
const EnvEmulator = "NEXJOB_EMULATOR"

// Emulator is a running default emulator.
type Emulator struct {
	// URL is its endpoint, http://127.0.0.1:PORT.
	URL    string
	shared bool // SharedEmulator's: Stop leaves it (it ends itself when idle)
	proc   *os.Process
	exited chan struct{} // closed when the process has ended
	dir    string
}

// Env returns the SDK settings that point a process at the emulator:
// AWS_ENDPOINT_URL, a region (AWS_REGION, and AWS_DEFAULT_REGION, which
// Python's boto3 reads: a Powertools peer in a test needs it) and dummy
// credentials (the emulator accepts any).
func (e *Emulator) Env() map[string]string {
	return map[string]string{
		"AWS_ENDPOINT_URL": e.URL, "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
		"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
	}
}

// Stop ends the emulator and removes its files; a shared one is left
// running (it ends itself after SharedIdle without a request).
func (e *Emulator) Stop() {
	if e.shared {
		return
	}
	_ = e.proc.Kill()
	<-e.exited
	_ = os.RemoveAll(e.dir)
}

// StartEmulator starts the default emulator on a free 127.0.0.1 port and
// waits until it answers (see the package documentation for which Python
// runs it).
func StartEmulator() (*Emulator, error) {
	dir, err := os.MkdirTemp("", "nexjob-emulator-")
	if err != nil {
		return nil, err
	}
	cmd, log, port, err := emulatorCommand(dir)
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = dieWithParent()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the emulator: %w", err)
	}
	em := &Emulator{URL: fmt.Sprintf("http://127.0.0.1:%d", port), proc: cmd.Process, exited: make(chan struct{}), dir: dir}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait(); close(em.exited) }()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		if r, err := http.Get(em.URL + "/moto-api/"); err == nil {
			_ = r.Body.Close()
			return em, nil
		}
		select {
		case err := <-waited:
			out, _ := os.ReadFile(log.Name())
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("the emulator exited (%w):\n%s", err, out)
		case <-time.After(100 * time.Millisecond):
		}
	}
	em.Stop()
	return nil, errors.New("the emulator did not answer in 30 s")
}

// emulatorCommand is the command that runs the default emulator from
// dir (its script written there) on a free 127.0.0.1 port, its output to
// dir's emulator.log (returned open), extra arguments after the port.
func emulatorCommand(dir string, extra ...string) (*exec.Cmd, *os.File, int, error) {
	py, err := motoPython()
	if err != nil {
		return nil, nil, 0, err
	}
	script := filepath.Join(dir, "emulator.py")
	if err := os.WriteFile(script, emulatorPy, 0o600); err != nil {
		return nil, nil, 0, err
	}
	port, err := freePort()
	if err != nil {
		return nil, nil, 0, err
	}
	log, err := os.Create(filepath.Join(dir, "emulator.log"))
	if err != nil {
		return nil, nil, 0, err
	}
	cmd := exec.Command(py, append([]string{script, "--port", strconv.Itoa(port)}, extra...)...)
	cmd.Stdout, cmd.Stderr = log, log
	return cmd, log, port, nil
}

// motoPython finds or makes a Python that has moto MotoVersion: the one
// NEXJOB_MOTO_PYTHON names, else the kit's own virtualenv in the user's
// cache directory, made there when missing from requirements.txt (every
// package pinned and hashed). It looks nowhere else: a Python found by
// searching the working directory's parents could be anyone's (a .cache
// planted in a shared temporary directory would run for every project
// below it).
func motoPython() (string, error) {
	if p := os.Getenv("NEXJOB_MOTO_PYTHON"); p != "" {
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no user cache directory for the emulator's virtualenv: %w (set NEXJOB_MOTO_PYTHON)", err)
	}
	venv := filepath.Join(cache, "nexjob", "moto-"+MotoVersion)
	py := filepath.Join(venv, "bin", "python")
	if hasMoto(py) {
		return py, nil
	}
	start := time.Now()
	notice(fmt.Sprintf("nexjobtest: installing the default emulator, moto[server]==%s and its pinned, hashed dependencies, into %s (once, from PyPI; about a minute)", MotoVersion, venv))
	if out, err := exec.Command("python3", "-m", "venv", venv).CombinedOutput(); err != nil {
		return "", fmt.Errorf("python3 -m venv %s: %w\n%s", venv, err, out)
	}
	req := filepath.Join(venv, "nexjob-requirements.txt")
	if err := os.WriteFile(req, requirements, 0o600); err != nil {
		return "", err
	}
	// Wheels only (no package is built from source) and no byte-compiling
	// at install: Python compiles what moto imports when it first starts.
	pip := exec.Command(filepath.Join(venv, "bin", "pip"), "install", "--progress-bar", "off", "--disable-pip-version-check",
		"--only-binary", ":all:", "--no-compile", "--require-hashes", "-r", req)
	var out bytes.Buffer
	pip.Stdout, pip.Stderr = &progress{out: &out}, &out
	if err := pip.Run(); err != nil {
		return "", fmt.Errorf("pip install --require-hashes -r %s: %w\n%s", req, err, out.String())
	}
	notice(fmt.Sprintf("nexjobtest: the default emulator is installed (%s)", time.Since(start).Round(time.Second)))
	return py, nil
}

// InstallEmulator installs the default emulator where the kit looks for
// it (see Main), if it is not there yet, and returns its Python: the
// warm-up a new app's README runs before its first go test
// (nexjob emulator --install), so that test prints its results, not an
// install.
func InstallEmulator() (string, error) { return motoPython() }

// progress passes pip's lines to notice as they come ("Collecting moto",
// …), so a first go test shows an install going on, not a hang, and
// keeps them for an error.
type progress struct {
	out  *bytes.Buffer
	line []byte
}

func (p *progress) Write(b []byte) (int, error) {
	p.out.Write(b)
	for _, c := range b {
		if c != '\n' {
			p.line = append(p.line, c)
			continue
		}
		if l := strings.TrimSpace(string(p.line)); strings.HasPrefix(l, "Collecting ") || strings.HasPrefix(l, "Installing ") || strings.HasPrefix(l, "Successfully ") {
			notice("nexjobtest: pip: " + l)
		}
		p.line = p.line[:0]
	}
	return len(b), nil
}

// notice says what the kit is doing while it does it: on stderr, and on
// the terminal when there is one, because go test holds a package's
// output back until it ends when it tests several packages.
var notice = func(msg string) {
	fmt.Fprintln(os.Stderr, msg)
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		_, _ = fmt.Fprintln(tty, msg)
		_ = tty.Close()
	}
}

func hasMoto(py string) bool {
	return exec.Command(py, "-c", "import moto, sys; sys.exit(moto.__version__ != '"+MotoVersion+"')").Run() == nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
