package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Rate is a limit of Limit events per Period: in every window of length
// Period (sliding, not calendar-aligned) at most Limit slots are taken.
type Rate struct {
	Limit  int
	Period time.Duration
}

// Bounds of a Rate. A key's item stays under 1 KB whatever the Limit
// (its last 16 slots exactly, counts for the rest: see rateCells), so a
// start costs one write unit and one read unit at every setting, and
// MaxRateLimit a MinRatePeriod is KeyWriteCeiling.
const (
	MaxRateLimit  = 1000
	MinRatePeriod = time.Second
	MaxRatePeriod = 24 * time.Hour
)

// Valid says what is wrong with r, or "".
func (r Rate) Valid() string {
	switch {
	case r.Limit < 1 || r.Limit > MaxRateLimit:
		return fmt.Sprintf("Limit %d is outside 1 to %d", r.Limit, MaxRateLimit)
	case r.Period < MinRatePeriod || r.Period > MaxRatePeriod:
		return fmt.Sprintf("Period %s is outside %s to %s", r.Period, MinRatePeriod, MaxRatePeriod)
	}
	return ""
}

// Attributes of a rate item (pk "r#<key hash>").
const (
	AttrRateLog = "rlog" // the last 16 "slot.tag" entries, oldest first; slot in base-36 Unix ms
	AttrItemVer = "rver" // incremented by every write of a rate or concurrency item: its optimistic lock
)

const ratePrefix = "r#"

// ErrContended: Reserve or Acquire lost the race for a key's item too
// many times in a row (a key taking hundreds of slots a second). Nothing
// was taken.
var ErrContended = errors.New("nexjob: rate or concurrency key contended; try again")

// RateTag is the tag a job's slots carry in a key's log: 8 characters
// from its id, so that taking a slot again for the same job finds it.
func RateTag(jobID string) string {
	s := sha256.Sum256([]byte(jobID))
	return base64.RawURLEncoding.EncodeToString(s[:6])
}

// Reserve takes the earliest slot at or after now in the log of keyHash
// (a Store.HashKey value) that keeps r: the later of now, the last slot
// taken, and the slot Limit entries back plus Period. It returns the slot
// and whether it was taken: with wait false a slot later than now is not
// taken (a rate limit refuses instead), and nothing is written. A Limit
// over 16 is kept on counts per 1/24 of the Period, each slot counted at
// the latest slot of its cell: a slot may then come up to Period/24 later
// than an exact log would give it, never sooner.
//
// A tag among the key's last 16 slots, taken within the last Period,
// gets its slot back, taken, with no write: a redelivered message, and a
// resend whose first write applied but whose reply was lost (the resend
// fails its version condition, the log is read again and shows the tag).
// A tag pushed out by 16 later slots takes a new slot (the old one goes
// unused: the rate holds, a slot is lost). A slot is one consistent read
// and one conditional PutItem of the key's item (under 1 KB: one write
// unit, one read unit, at every accepted Rate), on the key's own
// partition; a lost race reads and tries again (ErrContended after 20).
// The item expires (TTL) a Period after its last slot.
func (s *Store) Reserve(ctx context.Context, keyHash, tag string, r Rate, wait bool) (time.Time, bool, error) {
	if msg := r.Valid(); msg != "" {
		return time.Time{}, false, fmt.Errorf("nexjob: rate: %s", msg)
	}
	var slot time.Time
	var taken bool
	err := s.versioned(ctx, ratePrefix+keyHash, "rate log", func(item map[string]types.AttributeValue, now time.Time) map[string]types.AttributeValue {
		var put map[string]types.AttributeValue
		slot, taken, put = reserveIn(item, now, tag, r, wait)
		return put
	})
	if err != nil {
		return time.Time{}, false, err
	}
	return slot, taken, nil
}

// reserveIn is Reserve's decision on the rate item as read: the slot,
// whether it is taken, and the attributes to write (nil: none).
func reserveIn(item map[string]types.AttributeValue, now time.Time, tag string, r Rate, wait bool) (time.Time, bool, map[string]types.AttributeValue) {
	st := decodeRateState(item, r)
	if found, ok := st.log.find(tag, now.Add(-r.Period)); ok {
		return found, true, nil
	}
	slot := st.next(now, r)
	if !wait && slot.After(now) && st.fits(now, r) {
		// A refusal only over the limit: a slot a producer whose clock
		// runs ahead took "in the future" does not make now full.
		slot = now.Truncate(time.Millisecond)
	}
	if !wait && slot.After(now) {
		return slot, false, nil
	}
	st.insert(rateEntry{slot: slot, tag: tag})
	expires := slot
	if n := st.cells.newest(); n.After(expires) {
		expires = n
	}
	return slot, true, map[string]types.AttributeValue{
		AttrRateLog:   &types.AttributeValueMemberS{Value: st.log.String()},
		AttrRateCells: &types.AttributeValueMemberS{Value: st.cells.String()},
		AttrExpiresAt: &types.AttributeValueMemberN{Value: strconv.FormatInt(expires.Add(r.Period).Unix()+1, 10)},
	}
}

// versioned is a read-modify-write of the small item pk (a rate log, a
// concurrency key's holders): a consistent read, then decide (given the
// item and the ledger's clock) returns the attributes to put, or nil to
// write nothing, and the put is conditional on the item's version
// (AttrItemVer) being the one read. A lost race, or a resend of our own
// applied put whose reply was lost, fails that condition: read and decide
// again, which then sees our own write. ErrContended after 20 lost races.
func (s *Store) versioned(ctx context.Context, pk, what string, decide func(item map[string]types.AttributeValue, now time.Time) map[string]types.AttributeValue) error {
	for try := 0; try < 20; try++ {
		if try > 0 {
			if err := sleepCtx(ctx, time.Duration(rand.Int64N(int64(5*time.Millisecond)<<min(try, 6)))); err != nil {
				return err
			}
		}
		out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
			TableName:      aws.String(s.table),
			Key:            map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: pk}},
			ConsistentRead: aws.Bool(true),
		})
		if err != nil {
			return fmt.Errorf("nexjob: read %s in %s: %w", what, s.table, err)
		}
		var ver int64
		if v, ok := out.Item[AttrItemVer].(*types.AttributeValueMemberN); ok {
			ver, _ = strconv.ParseInt(v.Value, 10, 64)
		}
		put := decide(out.Item, s.now())
		if put == nil {
			return nil
		}
		put[AttrPK] = &types.AttributeValueMemberS{Value: pk}
		put[AttrItemVer] = &types.AttributeValueMemberN{Value: strconv.FormatInt(ver+1, 10)}
		cond := "attribute_not_exists(#pk)"
		vals := map[string]types.AttributeValue{}
		if ver > 0 {
			cond = "#ver = :old"
			vals[":old"] = &types.AttributeValueMemberN{Value: strconv.FormatInt(ver, 10)}
		}
		_, err = s.db.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:                 aws.String(s.table),
			Item:                      put,
			ConditionExpression:       aws.String(cond),
			ExpressionAttributeNames:  versionNames(ver),
			ExpressionAttributeValues: nonEmpty(vals),
		})
		var ccf *types.ConditionalCheckFailedException
		switch {
		case errors.As(err, &ccf):
			continue // another writer, or our own resend: read again
		case err != nil:
			return fmt.Errorf("nexjob: write %s in %s: %w", what, s.table, err)
		}
		return nil
	}
	return ErrContended
}

func versionNames(ver int64) map[string]string {
	if ver > 0 {
		return map[string]string{"#ver": AttrItemVer}
	}
	return map[string]string{"#pk": AttrPK}
}

func nonEmpty(m map[string]types.AttributeValue) map[string]types.AttributeValue {
	if len(m) == 0 {
		return nil
	}
	return m
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

type rateEntry struct {
	slot time.Time
	tag  string
}

// rateLog is a key's slots, oldest first (slots never go back in time).
type rateLog []rateEntry

func decodeRateLog(item map[string]types.AttributeValue) rateLog {
	s, _ := item[AttrRateLog].(*types.AttributeValueMemberS)
	if s == nil {
		return nil
	}
	var log rateLog
	for _, f := range strings.Fields(s.Value) {
		ms, tag, ok := strings.Cut(f, ".")
		n, err := strconv.ParseInt(ms, 36, 64)
		if !ok || err != nil {
			continue // not ours to keep
		}
		log = append(log, rateEntry{slot: time.UnixMilli(n), tag: tag})
	}
	return log
}

func (l rateLog) String() string {
	var b strings.Builder
	for i, e := range l {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatInt(e.slot.UnixMilli(), 36))
		b.WriteByte('.')
		b.WriteString(e.tag)
	}
	return b.String()
}

// find is tag's latest slot if it is after since.
func (l rateLog) find(tag string, since time.Time) (time.Time, bool) {
	for _, e := range slices.Backward(l) {
		if e.tag == tag {
			return e.slot, e.slot.After(since)
		}
	}
	return time.Time{}, false
}

// fits reports whether a slot at now keeps r whatever the clocks of the
// writers of the other slots: fewer than Limit slots lie within a Period
// either side of now (every window of Period holding now lies there),
// and the log, which keeps only the last Limit slots, lost none there.
// Producers' clocks skewed by less than Period then never refuse an
// enqueue under the limit.
func (l rateLog) fits(now time.Time, r Rate) bool {
	if len(l) >= r.Limit && l[0].slot.After(now.Add(-r.Period)) {
		return false // slots trimmed from a full log may lie in reach: cannot tell
	}
	n := 0
	for _, e := range l {
		if d := e.slot.Sub(now); d > -r.Period && d < r.Period {
			n++
		}
	}
	return n < r.Limit
}

// insert adds e in slot order (a slot taken at now may come before one a
// skewed writer took ahead of it).
func (l rateLog) insert(e rateEntry) rateLog {
	i := len(l)
	for i > 0 && l[i-1].slot.After(e.slot) {
		i--
	}
	return slices.Insert(l, i, e)
}

// next is the earliest slot at or after now that keeps r: at or after the
// last slot, and a Period after the slot Limit entries back.
func (l rateLog) next(now time.Time, r Rate) time.Time {
	slot := now.Truncate(time.Millisecond)
	if n := len(l); n > 0 && l[n-1].slot.After(slot) {
		slot = l[n-1].slot
	}
	if n := len(l); n >= r.Limit {
		if t := l[n-r.Limit].slot.Add(r.Period); t.After(slot) {
			slot = t
		}
	}
	return slot
}
