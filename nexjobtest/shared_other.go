//go:build !unix

package nexjobtest

import "errors"

// SharedEmulator is unix-only (it locks a file with flock): elsewhere
// each test binary starts its own (StartEmulator).
func SharedEmulator() (*Emulator, error) {
	return nil, errors.New("nexjobtest: a shared emulator needs a unix system")
}
