package nexjobtest

import "syscall"

// dieWithParent makes the emulator end with the process that started it,
// even when that one dies without stopping it (a test binary's panic).
func dieWithParent() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
