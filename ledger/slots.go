package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// AttrHolders is a concurrency item's map of holder tag (HolderTag) to
// lease end (Unix ms); its pk is "c#<key hash>".
const AttrHolders = "hold"

const concurrencyPrefix = "c#"

// MaxConcurrency bounds a concurrency key's Limit: each holder is 21
// bytes of the key's item (its 8-byte tag, its lease end), so at 40 the
// item stays under 1 KB: one write unit to take a slot and one to free
// it, one read unit, at every accepted Limit.
const MaxConcurrency = 40

// Holder names one run in a concurrency key's holders: the job and the
// claim's fencing token, so a later run of the same job (its lease
// expired, a new claim) never reads the old run's slot as its own, and a
// zombie's release frees only its own.
func Holder(rec Record) string { return rec.ID + "." + strconv.FormatInt(rec.Token, 10) }

// HolderTag is what a concurrency key's item keeps of a holder: 8
// characters of its hash (48 bits), whatever the length of the job's id.
// Holding and SlotHolders name holders by it.
func HolderTag(holder string) string { return RateTag("hold:" + holder) }

// Acquire takes one of the limit slots of keyHash (a Store.HashKey value)
// for holder until the end of its lease, or reports that none is free and
// when the first held one's lease ends (a crashed holder's slot frees
// itself then). Leases that ended are dropped as it writes. A holder
// already holding a slot keeps it (a redelivery, or a resend whose first
// put applied and whose reply was lost: the resend fails its version
// condition and the read shows the holder). One consistent read, and one
// conditional PutItem of the key's item when it takes the slot, on the
// key's own partition; ErrContended after 20 lost races.
func (s *Store) Acquire(ctx context.Context, keyHash, holder string, limit int, until time.Time) (ok bool, freeAt time.Time, err error) {
	if limit < 1 || limit > MaxConcurrency {
		return false, time.Time{}, fmt.Errorf("nexjob: concurrency limit %d is outside 1 to %d", limit, MaxConcurrency)
	}
	holder = HolderTag(holder)
	err = s.versioned(ctx, concurrencyPrefix+keyHash, "concurrency slots", func(item map[string]types.AttributeValue, now time.Time) map[string]types.AttributeValue {
		held := map[string]types.AttributeValue{}
		ok, freeAt = false, time.Time{}
		if m, isMap := item[AttrHolders].(*types.AttributeValueMemberM); isMap {
			for h, av := range m.Value {
				end, err := num(av)
				if err != nil || end <= now.UnixMilli() {
					continue // ended: its slot is free
				}
				if h == holder {
					ok = true
					return nil
				}
				held[h] = av
				if t := Millis(end); freeAt.IsZero() || t.Before(freeAt) {
					freeAt = t
				}
			}
		}
		if len(held) >= limit {
			return nil
		}
		ok = true
		held[holder] = &types.AttributeValueMemberN{Value: strconv.FormatInt(until.UnixMilli(), 10)}
		latest := until
		for _, av := range held {
			if end, err := num(av); err == nil && Millis(end).After(latest) {
				latest = Millis(end)
			}
		}
		return map[string]types.AttributeValue{
			AttrHolders:   &types.AttributeValueMemberM{Value: held},
			AttrExpiresAt: &types.AttributeValueMemberN{Value: strconv.FormatInt(TTL(latest.Add(time.Hour)), 10)},
		}
	})
	if err != nil {
		return false, time.Time{}, err
	}
	return ok, freeAt, nil
}

// SlotHolders lists the holders of keyHash's slots whose leases have not
// ended, by HolderTag, with their ends: one consistent read, for
// operators and tests.
func (s *Store) SlotHolders(ctx context.Context, keyHash string) (map[string]time.Time, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: concurrencyPrefix + keyHash}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("nexjob: read concurrency slots in %s: %w", s.table, err)
	}
	held := map[string]time.Time{}
	if m, ok := out.Item[AttrHolders].(*types.AttributeValueMemberM); ok {
		for h, av := range m.Value {
			if end, err := num(av); err == nil && end > s.now().UnixMilli() {
				held[h] = Millis(end)
			}
		}
	}
	return held, nil
}

// ReleaseSlot frees holder's slot of keyHash: one UpdateItem, and a no-op
// when the slot is not held (released already, its lease ended and
// another write dropped it, a resend of an applied release). It bumps the
// item's version, so an Acquire that read before it reads again.
func (s *Store) ReleaseSlot(ctx context.Context, keyHash, holder string) error {
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: concurrencyPrefix + keyHash}},
		ConditionExpression:       aws.String("attribute_exists(#hold.#me)"),
		UpdateExpression:          aws.String("REMOVE #hold.#me ADD #ver :one"),
		ExpressionAttributeNames:  map[string]string{"#hold": AttrHolders, "#me": HolderTag(holder), "#ver": AttrItemVer},
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return fmt.Errorf("nexjob: release concurrency slot in %s: %w", s.table, err)
	}
	return nil
}
