package recurring_test

import (
	"testing"
	"time"

	"github.com/nexjob/nexjob-aws/recurring"
)

func TestNext(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	start := at("2026-12-04T10:00:00Z")
	for _, c := range []struct {
		expr, tz, after, want string // want "" : none
	}{
		{"cron(0 2 * * ? *)", "", "2026-12-04T01:30:00Z", "2026-12-04T02:00:00Z"},
		{"cron(0 2 * * ? *)", "Europe/Paris", "2026-12-04T01:30:00Z", "2026-12-05T01:00:00Z"},
		{"cron(0/15 * * * ? *)", "", "2026-12-04T10:07:00Z", "2026-12-04T10:15:00Z"},
		{"cron(0 9 ? * MON-FRI *)", "", "2026-12-04T10:00:00Z", "2026-12-07T09:00:00Z"}, // a Friday: Monday next
		{"cron(30 12 1 JAN,JUL ? 2027)", "", "2026-12-04T10:00:00Z", "2027-01-01T12:30:00Z"},
		{"rate(5 minutes)", "", "2026-12-04T10:12:00Z", "2026-12-04T10:15:00Z"},
		{"rate(1 day)", "", "2026-12-04T09:00:00Z", "2026-12-05T10:00:00Z"},
		{"at(2026-12-24T18:00:00)", "", "2026-12-04T10:00:00Z", "2026-12-24T18:00:00Z"},
		{"at(2026-12-24T18:00:00)", "", "2026-12-25T00:00:00Z", ""},
		{"cron(0 0 L * ? *)", "", "2026-12-04T10:00:00Z", ""},
		{"cron(0 0 31 2 ? *)", "", "2026-12-04T10:00:00Z", ""}, // never
	} {
		got, ok := recurring.Next(c.expr, c.tz, start, at(c.after))
		switch {
		case c.want == "" && ok:
			t.Errorf("%s after %s: %s, want none", c.expr, c.after, got)
		case c.want != "" && (!ok || !got.Equal(at(c.want))):
			t.Errorf("%s (%s) after %s: %s %v, want %s", c.expr, c.tz, c.after, got.UTC(), ok, c.want)
		}
	}
}
