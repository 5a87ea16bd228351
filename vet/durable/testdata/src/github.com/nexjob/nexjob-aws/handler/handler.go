// Package handler declares, for the analyzer's tests only, the signatures
// of the real package's durable calls (type-checking needs them; nothing
// here runs).
package handler

import (
	"context"
	"time"
)

func Step[T any](ctx context.Context, name string, fn func(context.Context) (T, error)) (T, error) {
	var z T
	return z, nil
}

type StepOptions struct{}

func StepWith[T any](ctx context.Context, name string, o *StepOptions, fn func(context.Context) (T, error)) (T, error) {
	var z T
	return z, nil
}

func Sleep(ctx context.Context, name string, d time.Duration) error { return nil }

func WaitForSignal[T any](ctx context.Context, name string, timeout time.Duration) (T, error) {
	var z T
	return z, nil
}

func Compensate(ctx context.Context, name string, fn func(context.Context) error) error { return nil }
