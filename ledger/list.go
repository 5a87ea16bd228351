package ledger

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// ErrNotIndexed: List of a state the byState index does not hold (see
// Options.IndexAllStates).
var ErrNotIndexed = errors.New("nexjob: jobs in this state are not indexed for listing")

// ErrBadCursor: the cursor did not come from List.
var ErrBadCursor = errors.New("nexjob: malformed list cursor")

// Indexed reports whether records in state st carry the byState index key.
func (s *Store) Indexed(st State) bool {
	if s.indexAll {
		return st.Valid()
	}
	switch st {
	case Scheduled, AwaitingContinuation, Failed, Expired:
		return true
	}
	return false
}

// listKey is the byState index partition key of job id in state st:
// "State#shard", the shard fixed by the id (FNV-1a), so each job's
// entries stay on one value and the jobs of a state spread over
// IndexShards values.
func (s *Store) listKey(st State, id string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return string(st) + "#" + strconv.Itoa(int(h.Sum32()%uint32(s.shards)))
}

// listKeys are every partition key value state st's entries may have:
// each shard's, and the unsharded one of records written before the
// index was sharded (they move to their shard at their next write).
func (s *Store) listKeys(st State, shards int) []string {
	keys := make([]string, 0, shards+1)
	for i := range shards {
		keys = append(keys, string(st)+"#"+strconv.Itoa(i))
	}
	return append(keys, string(st))
}

// withIndex adds to upd the index attributes for job id's move to state
// st: set when st is indexed, removed otherwise (removing absent
// attributes costs no index write).
func (s *Store) withIndex(upd expression.UpdateBuilder, st State, id string, nowMs int64) expression.UpdateBuilder {
	if s.Indexed(st) {
		return upd.Set(expression.Name(AttrListState), expression.Value(s.listKey(st, id))).
			Set(expression.Name(AttrListAt), expression.Value(nowMs))
	}
	return upd.Remove(expression.Name(AttrListState)).Remove(expression.Name(AttrListAt))
}

// List returns up to limit jobs in state st, most recently changed first,
// and a cursor for the next page ("" at the end): Find of an indexed state
// with no other filter. A state the byState index does not hold gives
// ErrNotIndexed (Find would scan it).
func (s *Store) List(ctx context.Context, st State, limit int, cursor string) ([]Record, string, error) {
	if !s.Indexed(st) {
		return nil, "", fmt.Errorf("%w: %s", ErrNotIndexed, st)
	}
	return s.Find(ctx, Filter{State: st, Limit: limit, Cursor: cursor})
}

func encodeCursor(key map[string]types.AttributeValue) (string, error) {
	if len(key) == 0 {
		return "", nil
	}
	plain := map[string]string{}
	for k, v := range key {
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			plain["s:"+k] = v.Value
		case *types.AttributeValueMemberN:
			plain["n:"+k] = v.Value
		default:
			return "", fmt.Errorf("nexjob: unexpected key attribute %s", k)
		}
	}
	b, err := json.Marshal(plain)
	return base64.RawURLEncoding.EncodeToString(b), err
}

func decodeCursor(c string) (map[string]types.AttributeValue, error) {
	if c == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, ErrBadCursor
	}
	var plain map[string]string
	if json.Unmarshal(b, &plain) != nil || (len(plain) != 3 && len(plain) != 1) {
		return nil, ErrBadCursor
	}
	key := map[string]types.AttributeValue{}
	for k, v := range plain {
		switch k {
		case "s:" + AttrPK, "s:" + AttrListState:
			key[k[2:]] = &types.AttributeValueMemberS{Value: v}
		case "n:" + AttrListAt:
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				return nil, ErrBadCursor
			}
			key[k[2:]] = &types.AttributeValueMemberN{Value: v}
		default:
			return nil, ErrBadCursor
		}
	}
	return key, nil
}
