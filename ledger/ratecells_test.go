package ledger

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The counted log (a Limit over 16) keeps the rate: random arrivals,
// each taking the slot Reserve's decision gives on the item as written
// back by the one before: no window of Period ever holds more than Limit
// slots, and each slot is at most a cell (Period/24) later than an exact
// log of every slot taken so far would give. Without wait, a refusal
// comes only when Limit slots lie within a Period and a cell of now.
func TestCountedLogKeepsTheRate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		r     Rate
		mean  time.Duration // between arrivals
		burst int           // arrivals at the same instant
	}{
		{Rate{Limit: 17, Period: time.Second}, 10 * time.Millisecond, 1},
		{Rate{Limit: 50, Period: time.Minute}, 200 * time.Millisecond, 3},
		{Rate{Limit: 1000, Period: time.Hour}, 2 * time.Second, 7},
		{Rate{Limit: MaxRateLimit, Period: MaxRatePeriod}, 30 * time.Second, 20},
	} {
		t.Run(fmt.Sprintf("%d per %s", c.r.Limit, c.r.Period), func(t *testing.T) {
			t.Parallel()
			for _, wait := range []bool{true, false} {
				rng := rand.New(rand.NewPCG(uint64(c.r.Limit), 7))
				now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
				item := map[string]types.AttributeValue{}
				var all rateLog // every slot taken, exact
				w := time.Duration(cellWidth(c.r.Period)) * time.Millisecond
				mean := c.mean
				if !wait {
					mean = c.r.Period / time.Duration(c.r.Limit) // about the limit: some refused
				}
				for i := range 4 * c.r.Limit {
					if i%c.burst == 0 {
						now = now.Add(time.Duration(rng.ExpFloat64() * float64(mean) * float64(c.burst)))
					}
					exactNext := all.next(now, c.r)
					slot, taken, put := reserveIn(item, now, RateTag(fmt.Sprint(wait, i)), c.r, wait)
					if slot.Before(exactNext) || slot.Sub(exactNext) >= w && (wait || taken) {
						t.Fatalf("wait %v, arrival %d: slot %s, an exact log gives %s (a cell is %s)", wait, i, slot, exactNext, w)
					}
					if !taken {
						if n := within(all, now, c.r.Period+w); n < c.r.Limit {
							t.Fatalf("arrival %d refused with %d slots within a Period and a cell of now; the limit is %d", i, n, c.r.Limit)
						}
						continue
					}
					all = all.insert(rateEntry{slot: slot})
					for k, v := range put {
						item[k] = v
					}
				}
				s := make([]time.Time, len(all))
				for i, e := range all {
					s[i] = e.slot
				}
				slices.SortFunc(s, time.Time.Compare)
				for i := c.r.Limit; i < len(s); i++ {
					if s[i].Sub(s[i-c.r.Limit]) < c.r.Period {
						t.Fatalf("wait %v: %d slots within %s", wait, c.r.Limit+1, s[i].Sub(s[i-c.r.Limit]))
					}
				}
				t.Logf("wait %v: %d slots taken, the last %s after the first", wait, len(s), s[len(s)-1].Sub(s[0]))
			}
		})
	}
}

// within counts the slots less than a Period from now, either side.
func within(l rateLog, now time.Time, p time.Duration) int {
	n := 0
	for _, e := range l {
		if d := e.slot.Sub(now); d > -p && d < p {
			n++
		}
	}
	return n
}

// Counts kept for one Period move to another's cells (the kind's Period
// changed), each slot at its cell's latest; a log from before the counts
// existed is counted from its slots.
func TestCountedLogAcrossChanges(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	item := map[string]types.AttributeValue{}
	r := Rate{Limit: 40, Period: time.Minute}
	for i := range 40 {
		_, _, put := reserveIn(item, now.Add(time.Duration(i)*time.Second), RateTag(fmt.Sprint(i)), r, true)
		for k, v := range put {
			item[k] = v
		}
	}
	// A Period of two minutes: the 40 slots (the last at +39 s) fill it.
	longer := Rate{Limit: 40, Period: 2 * time.Minute}
	slot, _, _ := reserveIn(item, now.Add(40*time.Second), RateTag("next"), longer, true)
	if min := now.Add(2 * time.Minute); slot.Before(min) {
		t.Fatalf("after a change of Period: slot %s, before %s", slot.Sub(now), min.Sub(now))
	}
	// An item of the old format: a log of 40 slots and no counts.
	var old rateLog
	for i := range 40 {
		old = append(old, rateEntry{slot: now.Add(time.Duration(i) * time.Second), tag: RateTag(fmt.Sprint(i))})
	}
	legacy := map[string]types.AttributeValue{AttrRateLog: &types.AttributeValueMemberS{Value: old.String()}}
	slot, taken, put := reserveIn(legacy, now.Add(40*time.Second), RateTag("next"), r, true)
	if !taken || slot.Before(now.Add(time.Minute)) {
		t.Fatalf("an old log of 40 slots at Limit 40: slot +%s taken %v, want a minute after the first", slot.Sub(now), taken)
	}
	if got := decodeRateLog(put); len(got) != rateTags {
		t.Fatalf("the log kept %d slots, want the last %d", len(got), rateTags)
	}
}
