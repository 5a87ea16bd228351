package ledger

import (
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// A rate item keeps two bounded records of its key's slots, so that its
// size, and a start's cost, never grows with the Limit:
//
//   - the last rateTags slots exactly, each with its tag (AttrRateLog):
//     a redelivery or a resend finds its own slot there, and a Limit up
//     to rateTags is kept exactly, as a plain sliding log;
//   - counts of slots per cell of 1/rateCellsPerPeriod of the Period,
//     with the latest slot in each (AttrRateCells), over the last two
//     Periods: a Limit over rateTags is kept on them.
//
// The counts are conservative: each slot counts as taken at the latest
// slot of its cell, so a slot they give may come up to a cell
// (Period/rateCellsPerPeriod) later than an exact log's, never sooner,
// and no window of Period ever holds more than Limit slots.
const (
	rateTags           = 16
	rateCellsPerPeriod = 24
	// AttrRateCells: "<cell ms>:<first cell>:<known from>:<count>.<latest>,..."
	// in base 36, the latest slot as ms into its cell, an empty cell as
	// nothing; counts before the cell known from were dropped.
	AttrRateCells = "rcnt"
)

// KeyWriteCeiling is the write units a second DynamoDB gives one
// partition, and so one flow-control key's item: each start costs one
// (rate and concurrency items stay under 1 KB at every accepted
// setting), so one throttled key takes at most this many starts a second,
// and one concurrency key half as many runs (a write to take the slot,
// one to free it). A kind limited as a whole (Key nil) has one key for
// all its jobs.
const KeyWriteCeiling = 1000

// rateCells counts a key's slots per cell of w ms, cells base to
// base+len(n)-1; late[i] is the latest slot in cell base+i, in ms into
// the cell.
type rateCells struct {
	w, base int64
	n, late []int64
	from    int64 // the first cell whose count is known (earlier ones were dropped)
}

func cellWidth(p time.Duration) int64 {
	return max(1, (p.Milliseconds()+rateCellsPerPeriod-1)/rateCellsPerPeriod)
}

// decodeRateCells reads the counts for a width of w ms; counts kept at
// another width (the Period changed) are moved to this one, each slot at
// its cell's latest. ok is false when there are none (an item the
// counts never knew: they are rebuilt from its log).
func decodeRateCells(item map[string]types.AttributeValue, w int64) (c rateCells, ok bool) {
	c.w = w
	s, _ := item[AttrRateCells].(*types.AttributeValueMemberS)
	if s == nil {
		return c, false
	}
	f := strings.SplitN(s.Value, ":", 4)
	if len(f) != 4 {
		return c, false
	}
	ow, err1 := strconv.ParseInt(f[0], 36, 64)
	base, err2 := strconv.ParseInt(f[1], 36, 64)
	if err1 != nil || err2 != nil || ow < 1 {
		return c, false
	}
	from, err3 := strconv.ParseInt(f[2], 36, 64)
	if err3 != nil {
		return c, false
	}
	old := rateCells{w: ow, base: base, from: from}
	if f[3] != "" {
		for _, cell := range strings.Split(f[3], ",") {
			var n, late int64
			if cell != "" {
				ns, ls, _ := strings.Cut(cell, ".")
				var err error
				if n, err = strconv.ParseInt(ns, 36, 64); err != nil || n < 0 {
					return c, false
				}
				if late, err = strconv.ParseInt(ls, 36, 64); err != nil || late < 0 || late >= ow {
					return c, false
				}
			}
			old.n, old.late = append(old.n, n), append(old.late, late)
		}
	}
	if ow == w {
		return old, true
	}
	c.from = (old.from*ow + w - 1) / w // a cell part-known is not known
	for i := range old.n {
		c.add(old.at(i), old.n[i])
	}
	return c, true
}

// at is the latest slot of cell base+i: where its slots count.
func (c *rateCells) at(i int) time.Time { return Millis((c.base+int64(i))*c.w + c.late[i]) }

// add counts n slots at slot.
func (c *rateCells) add(slot time.Time, n int64) {
	ms := slot.UnixMilli()
	idx := ms / c.w
	if len(c.n) == 0 {
		c.base = idx
	}
	if idx < c.base {
		// Older than the cells kept (a writer's clock far behind): count it
		// in the oldest, later than it was (conservative).
		idx, ms = c.base, c.base*c.w
	}
	for c.base+int64(len(c.n)) <= idx {
		c.n, c.late = append(c.n, 0), append(c.late, 0)
	}
	i := idx - c.base
	c.n[i] += n
	c.late[i] = max(c.late[i], ms-idx*c.w)
	// Keep two Periods back from the latest cell: no slot older than a
	// Period before the newest bears on the next, nor (clocks within a
	// Period) on a refusal.
	if drop := int64(len(c.n)) - 2*rateCellsPerPeriod - 1; drop > 0 {
		for i := range drop {
			if c.n[i] > 0 {
				c.from = max(c.from, c.base+i+1)
			}
		}
		c.n, c.late = c.n[drop:], c.late[drop:]
		c.base += drop
	}
	for len(c.n) > 0 && c.n[0] == 0 {
		c.n, c.late = c.n[1:], c.late[1:]
		c.base++
	}
}

// newest is the latest slot counted, zero when none.
func (c *rateCells) newest() time.Time {
	for i := len(c.n) - 1; i >= 0; i-- {
		if c.n[i] > 0 {
			return c.at(i)
		}
	}
	return time.Time{}
}

// next is the earliest slot at or after now that keeps r on the counts:
// at or after the newest, and a Period after the Limit-th latest.
func (c *rateCells) next(now time.Time, r Rate) time.Time {
	slot := now.Truncate(time.Millisecond)
	if n := c.newest(); n.After(slot) {
		slot = n
	}
	acc := int64(0)
	for i := len(c.n) - 1; i >= 0; i-- {
		if acc += c.n[i]; acc >= int64(r.Limit) {
			if t := c.at(i).Add(r.Period); t.After(slot) {
				slot = t
			}
			break
		}
	}
	return slot
}

// fits is rateLog.fits on the counts: fewer than Limit slots may lie
// within a Period either side of now (a cell counts when any of its
// slots may), and none were dropped there.
func (c *rateCells) fits(now time.Time, r Rate) bool {
	lo, hi := now.Add(-r.Period), now.Add(r.Period)
	if Millis(c.from * c.w).After(lo) {
		return false // cannot tell
	}
	n := int64(0)
	for i := range c.n {
		first := Millis((c.base + int64(i)) * c.w)
		if c.n[i] > 0 && c.at(i).After(lo) && first.Before(hi) {
			n += c.n[i]
		}
	}
	return n < int64(r.Limit)
}

func (c *rateCells) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(c.w, 36))
	b.WriteByte(':')
	b.WriteString(strconv.FormatInt(c.base, 36))
	b.WriteByte(':')
	b.WriteString(strconv.FormatInt(c.from, 36))
	b.WriteByte(':')
	for i := range c.n {
		if i > 0 {
			b.WriteByte(',')
		}
		if c.n[i] > 0 {
			b.WriteString(strconv.FormatInt(c.n[i], 36))
			b.WriteByte('.')
			b.WriteString(strconv.FormatInt(c.late[i], 36))
		}
	}
	return b.String()
}

// rateState is what Reserve reads of a rate item and writes back.
type rateState struct {
	log   rateLog   // the last rateTags slots, exact
	cells rateCells // every slot of the last two Periods, counted
}

func decodeRateState(item map[string]types.AttributeValue, r Rate) rateState {
	st := rateState{log: decodeRateLog(item)}
	var ok bool
	if st.cells, ok = decodeRateCells(item, cellWidth(r.Period)); !ok {
		// Written before the counts (its log kept up to Limit slots), or
		// unreadable: counted from the log.
		for _, e := range st.log {
			st.cells.add(e.slot, 1)
		}
		if len(st.log) > 0 {
			st.cells.from = st.cells.base // the log may have dropped older slots
		}
	}
	st.log = st.log.last(rateTags)
	return st
}

// exact: a Limit the exact log keeps by itself.
func exact(r Rate) bool { return r.Limit <= rateTags }

func (st *rateState) next(now time.Time, r Rate) time.Time {
	if exact(r) {
		return st.log.next(now, r)
	}
	return st.cells.next(now, r)
}

func (st *rateState) fits(now time.Time, r Rate) bool {
	if exact(r) {
		return st.log.fits(now, r)
	}
	return st.cells.fits(now, r)
}

func (st *rateState) insert(e rateEntry) {
	st.log = st.log.insert(e).last(rateTags)
	st.cells.add(e.slot, 1)
}

// last keeps the latest n entries.
func (l rateLog) last(n int) rateLog {
	if len(l) > n {
		return l[len(l)-n:]
	}
	return l
}
