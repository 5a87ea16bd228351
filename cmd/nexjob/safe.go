package main

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"unicode"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// clean makes s safe to print on a terminal: control characters (ESC,
// CR, LF, NUL, tab, DEL, the C1 set) and the invisible bidi and
// direction marks that reorder what a reader sees become visible escapes
// (\x1b, \n, \u202e). Every field the CLI prints from a record, a message
// or an error goes through it: a job's kind, last error and args are
// whatever a producer wrote.
func clean(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == unicode.ReplacementChar:
			b.WriteString(`\ufffd`)
		case r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0:
			fmt.Fprintf(&b, `\x%02x`, r)
		case bidi(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// bidi reports the explicit direction controls and marks (Trojan Source).
func bidi(r rune) bool {
	switch {
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	case r == 0x200e, r == 0x200f, r == 0x061c:
		return true
	}
	return false
}

// confirm asks a yes/no question on the terminal. Off a terminal it does
// not ask: scripts proceed (bulk actions) unless the caller says a
// script must pass --yes.
func (c *cli) confirm(question string) bool {
	fmt.Fprintf(c.stderr, "%s [y/N] ", question)
	line, _ := bufio.NewReader(c.stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}

// ErrNotConfirmed: the operator said no, or a bulk action on a terminal
// got no answer.
var ErrNotConfirmed = fmt.Errorf("not confirmed: nothing was changed (--yes skips the question)")

// askBulk asks before a bulk action on a terminal; --yes and --dry-run
// (which changes nothing) skip it, as does a script (no terminal).
func (c *cli) askBulk(f *flags, what string) error {
	if f.yes || f.dryRun || !c.interactive {
		return nil
	}
	if !c.confirm(what + "?") {
		return ErrNotConfirmed
	}
	return nil
}

// realAccount guards provision and demo: with no AWS_ENDPOINT_URL they
// would create tables and queues in a real AWS account. It prints the
// account (STS GetCallerIdentity) and the region, and asks; a script must
// pass --yes.
func (c *cli) realAccount(ctx context.Context, cfg aws.Config, f *flags, what string) error {
	if c.getenv("AWS_ENDPOINT_URL") != "" {
		return nil // an emulator or LocalStack
	}
	id, err := sts.NewFromConfig(cfg).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		return fmt.Errorf("no AWS_ENDPOINT_URL, so %s would use a real AWS account, and its identity could not be read: %w", what, err)
	}
	msg := fmt.Sprintf("%s in REAL AWS account %s (%s), region %s", what, aws.ToString(id.Account), clean(aws.ToString(id.Arn)), cfg.Region)
	fmt.Fprintln(c.stderr, "nexjob: "+msg)
	switch {
	case f.yes:
		return nil
	case !c.interactive:
		return fmt.Errorf("%s: refusing without --yes (no terminal to ask); set AWS_ENDPOINT_URL for an emulator", msg)
	case !c.confirm("Go ahead?"):
		return ErrNotConfirmed
	}
	return nil
}
