//go:build !linux

package nexjobtest

import "syscall"

// dieWithParent: only Linux has a parent-death signal; elsewhere an
// emulator whose test binary died must be stopped by hand.
func dieWithParent() *syscall.SysProcAttr { return nil }
