//go:build unix

package nexjobtest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// SharedIdle is how long a shared emulator waits without a request before
// it ends itself.
const SharedIdle = 2 * time.Minute

// sharedState is what the first test binary wrote of the emulator it
// started, for the others to find.
type sharedState struct {
	URL     string `json:"url"`
	PID     int    `json:"pid"`
	Version string `json:"version"` // MotoVersion and the emulator script's hash: another build starts its own
}

// SharedEmulator finds the emulator the test binaries of this user share
// on this machine, or starts it: under a lock (flock) on a file in the
// user's cache directory, a state file names its URL and process; if it
// answers and is of this kit's version, it is used; else one is started,
// detached (it outlives the binary that started it, and ends itself after
// SharedIdle without a request), and the state written. Tests isolate
// themselves by their tables' and queues' names (New), so packages share
// it safely; go test ./... pays one start, not one per package.
func SharedEmulator() (*Emulator, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cache, "nexjob", "shared-emulator")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() { _ = lock.Close() }()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	sum := sha256.Sum256(emulatorPy)
	version := MotoVersion + "/" + hex.EncodeToString(sum[:8])
	statePath := filepath.Join(dir, "state.json")
	var st sharedState
	if b, err := os.ReadFile(statePath); err == nil && json.Unmarshal(b, &st) == nil && st.Version == version && alive(st) {
		return &Emulator{URL: st.URL, shared: true}, nil
	}
	cmd, log, port, err := emulatorCommand(dir, "--idle-exit", strconv.Itoa(int(SharedIdle.Seconds())))
	if err != nil {
		return nil, err
	}
	defer func() { _ = log.Close() }()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // its own session: it outlives this binary
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the shared emulator: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	st = sharedState{URL: fmt.Sprintf("http://127.0.0.1:%d", port), PID: cmd.Process.Pid, Version: version}
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		if alive(st) {
			b, _ := json.Marshal(st)
			if err := os.WriteFile(statePath, b, 0o600); err != nil {
				return nil, err
			}
			return &Emulator{URL: st.URL, shared: true}, nil
		}
		select {
		case err := <-exited:
			out, _ := os.ReadFile(log.Name())
			return nil, fmt.Errorf("the shared emulator exited (%w):\n%s", err, out)
		case <-time.After(100 * time.Millisecond):
		}
	}
	_ = cmd.Process.Kill()
	return nil, errors.New("the shared emulator did not answer in 30 s")
}

// alive reports whether st's process runs and its emulator answers.
func alive(st sharedState) bool {
	if st.PID <= 0 || syscall.Kill(st.PID, 0) != nil {
		return false
	}
	c := http.Client{Timeout: 2 * time.Second}
	r, err := c.Get(st.URL + "/moto-api/")
	if err != nil {
		return false
	}
	_ = r.Body.Close()
	return r.StatusCode == http.StatusOK
}
