package soak

import "context"

// A checker holds one or more of the promises the README's soak section
// lists ("Promises the soak checks"): given the facts of a run, it returns
// a violation for each break it finds. TestEveryPromiseHasAChecker fails
// when a promise names no checker here, or a checker no promise.
type checker func(context.Context, *facts) []string

// Checkers are the soak's checkers by the name the README gives them.
var Checkers = map[string]checker{
	"records":     checkRecords,
	"policy":      checkPolicy,
	"ends":        checkEnds,
	"concurrency": func(_ context.Context, f *facts) []string { return concurrencyViolations(f.recs, f.rs) },
	"throttle":    checkThrottle,
	"ratelimit":   checkRateLimit,
	"firings":     checkFirings,
	"listing":     checkListing,
	"durable":     checkDurable,
	"children":    checkChildren,
	"flows":       checkFlows,
	"calls":       checkCalls,
}
