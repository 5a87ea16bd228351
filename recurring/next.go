package recurring

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Next returns the first firing of the schedule expression expr after
// after, in the IANA zone tz ("" is UTC): EventBridge Scheduler's own API
// does not say. cron(minutes hours day-of-month month day-of-week year)
// with *, ?, lists, ranges, steps and names (JAN, MON); rate(n unit)
// from start (the schedule's creation); at(yyyy-mm-ddThh:mm:ss).
// ok=false, with the zero time: no firing within a year and a day (a past at(), or an
// expression using L, W or #, which Next does not evaluate).
func Next(expr, tz string, start, after time.Time) (time.Time, bool) {
	loc := time.UTC
	if tz != "" {
		l, err := time.LoadLocation(tz)
		if err != nil {
			return time.Time{}, false
		}
		loc = l
	}
	switch {
	case strings.HasPrefix(expr, "at(") && strings.HasSuffix(expr, ")"):
		t, err := time.ParseInLocation("2006-01-02T15:04:05", expr[3:len(expr)-1], loc)
		if err != nil || !t.After(after) {
			return time.Time{}, false
		}
		return t, true
	case strings.HasPrefix(expr, "rate(") && strings.HasSuffix(expr, ")"):
		every, err := rate(expr[5 : len(expr)-1])
		if err != nil || start.IsZero() {
			return time.Time{}, false
		}
		if !after.After(start) {
			return start.Add(every), true
		}
		n := after.Sub(start)/every + 1
		return start.Add(n * every), true
	case strings.HasPrefix(expr, "cron(") && strings.HasSuffix(expr, ")"):
		c, err := parseCron(expr[5 : len(expr)-1])
		if err != nil {
			return time.Time{}, false
		}
		t := after.In(loc).Truncate(time.Minute).Add(time.Minute)
		for end := t.AddDate(1, 0, 1); t.Before(end); t = t.Add(time.Minute) {
			if c.match(t) {
				return t, true
			}
		}
	}
	return time.Time{}, false
}

func rate(s string) (time.Duration, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, fmt.Errorf("rate %q", s)
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("rate %q", s)
	}
	unit := map[string]time.Duration{"minute": time.Minute, "minutes": time.Minute, "hour": time.Hour, "hours": time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour}[f[1]]
	if unit == 0 {
		return 0, fmt.Errorf("rate unit %q", f[1])
	}
	return time.Duration(n) * unit, nil
}

// cron is a parsed six-field AWS cron expression: for each field, the
// values it allows (nil: any).
type cron struct{ min, hour, dom, mon, dow, year map[int]bool }

// unsupportedLW: a last or nearest-weekday day (5L, 15W).
var unsupportedLW = regexp.MustCompile(`^\d+[LW]$`)

var monthNames = map[string]int{"JAN": 1, "FEB": 2, "MAR": 3, "APR": 4, "MAY": 5, "JUN": 6, "JUL": 7, "AUG": 8, "SEP": 9, "OCT": 10, "NOV": 11, "DEC": 12}
var dayNames = map[string]int{"SUN": 1, "MON": 2, "TUE": 3, "WED": 4, "THU": 5, "FRI": 6, "SAT": 7}

func parseCron(s string) (cron, error) {
	f := strings.Fields(s)
	if len(f) != 6 {
		return cron{}, fmt.Errorf("cron %q: six fields", s)
	}
	var c cron
	var err error
	for i, spec := range []struct {
		out    *map[int]bool
		lo, hi int
		names  map[string]int
		isDay  bool
	}{{&c.min, 0, 59, nil, false}, {&c.hour, 0, 23, nil, false}, {&c.dom, 1, 31, nil, true}, {&c.mon, 1, 12, monthNames, false}, {&c.dow, 1, 7, dayNames, true}, {&c.year, 1970, 2199, nil, false}} {
		if *spec.out, err = field(f[i], spec.lo, spec.hi, spec.names); err != nil {
			return cron{}, err
		}
	}
	return c, nil
}

// field parses one cron field: *, ?, and comma-separated values, ranges
// (a-b) and steps (a/n, */n, a-b/n).
func field(s string, lo, hi int, names map[string]int) (map[int]bool, error) {
	if s == "*" || s == "?" {
		return nil, nil
	}
	if strings.Contains(s, "#") || s == "L" || s == "LW" || unsupportedLW.MatchString(s) {
		return nil, fmt.Errorf("cron field %q: L, W and # are not evaluated", s)
	}
	value := func(v string) (int, error) {
		if n, ok := names[strings.ToUpper(v)]; ok {
			return n, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("cron value %q", v)
		}
		return n, nil
	}
	out := map[int]bool{}
	for part := range strings.SplitSeq(s, ",") {
		rng, step := part, 1
		if r, st, ok := strings.Cut(part, "/"); ok {
			n, err := strconv.Atoi(st)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("cron step %q", part)
			}
			rng, step = r, n
		}
		from, to := lo, hi
		switch a, b, ok := strings.Cut(rng, "-"); {
		case rng == "*":
		case ok:
			var err error
			if from, err = value(a); err != nil {
				return nil, err
			}
			if to, err = value(b); err != nil {
				return nil, err
			}
		default:
			v, err := value(rng)
			if err != nil {
				return nil, err
			}
			from = v
			if step == 1 {
				to = v
			}
		}
		for v := from; v <= to; v += step {
			out[v] = true
		}
	}
	return out, nil
}

func (c cron) match(t time.Time) bool {
	in := func(set map[int]bool, v int) bool { return set == nil || set[v] }
	return in(c.min, t.Minute()) && in(c.hour, t.Hour()) && in(c.mon, int(t.Month())) && in(c.year, t.Year()) &&
		in(c.dom, t.Day()) && in(c.dow, int(t.Weekday())+1)
}
