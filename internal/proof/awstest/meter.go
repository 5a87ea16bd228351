package awstest

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/nexjob/nexjob-aws/ledger"
)

// Units is what a stretch of requests costs as DynamoDB, SQS and
// EventBridge Scheduler bill it, counted by a Meter from the requests and
// the items they touched (the emulator's own ConsumedCapacity is a
// constant, not a bill).
type Units struct {
	// Write is the table's write units: each item written, its size in KB
	// rounded up (the larger of before and after, at least 1; a write
	// whose condition failed pays for the item it met), twice in a
	// TransactWriteItems.
	Write int
	// Index is the byState index's write units: an entry put or removed
	// (a moved entry is both), its projected size in KB rounded up.
	Index int
	// Read is read units: per 4 KB of the item read, rounded up, 1 for a
	// consistent read, 0.5 for an eventually consistent one, 2 in a
	// transaction.
	Read float64
	// Sends is SQS SendMessage and SendMessageBatch requests.
	Sends int
	// Schedules is Scheduler CreateSchedule requests.
	Schedules int
}

// Add returns u plus v.
func (u Units) Add(v Units) Units {
	return Units{Write: u.Write + v.Write, Index: u.Index + v.Index, Read: u.Read + v.Read, Sends: u.Sends + v.Sends, Schedules: u.Schedules + v.Schedules}
}

func (u Units) String() string {
	return fmt.Sprintf("%d write units + %d index, %g read units, %d sends, %d CreateSchedule", u.Write, u.Index, u.Read, u.Sends, u.Schedules)
}

// Meter is a Counter that also counts the Units of the requests
// (GetItem, TransactGetItems and the writes; Query and Scan once asked:
// Queries).
type Meter struct {
	*Counter
	db      *dynamodb.Client // uncounted: reads the items before and after each write
	units   Units
	queries bool
}

// Queries makes m count the read units of Query and Scan requests too
// (in Units.Read), as DynamoDB bills them: the items each request
// evaluated (before its filter; whole items, whatever its projection;
// an index's entries by their projection plus 100 bytes each), summed
// and rounded up to 4 KB, half a unit per 4 KB eventually consistent, a
// unit consistent. It reads them again through the uncounted client
// after the request (its key condition, start key and limit, no filter
// or projection), so the figures hold for reads that no writer races. Off
// by default (the cost tests of the write paths pin Units without them).
func (m *Meter) Queries() *Meter {
	m.mu.Lock()
	m.queries = true
	m.mu.Unlock()
	return m
}

// Meter installs a Meter on cfg, which must reach this Env's backend (see
// NewMeter).
func (e *Env) Meter(cfg *aws.Config) *Meter { return NewMeter(cfg, e.DB) }

// NewMeter installs a Meter on cfg; clients built from cfg afterwards
// report to it. A write's items are read through db (uncounted,
// consistent) before and after it, so a Meter's figures hold for requests
// that do not race other writers of the same items, as in the cost tests.
func NewMeter(cfg *aws.Config, db *dynamodb.Client) *Meter {
	m := &Meter{Counter: Count(cfg), db: db}
	cfg.APIOptions = append(cfg.APIOptions, func(s *middleware.Stack) error {
		return s.Initialize.Add(middleware.InitializeMiddlewareFunc("nexjobMeter",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				writes := m.writesOf(in.Parameters)
				before := m.items(ctx, writes)
				out, md, err := next.HandleInitialize(ctx, in)
				after := m.items(ctx, writes)
				u := m.unitsOf(writes, before, after)
				m.mu.Lock()
				queries := m.queries
				m.mu.Unlock()
				if queries && err == nil {
					u.Read += m.queryUnits(ctx, in.Parameters)
				}
				m.mu.Lock()
				m.units = m.units.Add(u)
				m.mu.Unlock()
				return out, md, err
			}), middleware.After)
	})
	return m
}

// Units returns the units so far.
func (m *Meter) Units() Units {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.units
	u.Sends, u.Schedules = countCalls(m.calls)
	return u
}

// Reset forgets the requests and units so far.
func (m *Meter) Reset() {
	m.mu.Lock()
	m.calls, m.units = nil, Units{}
	m.mu.Unlock()
}

// target is an item a request reads or writes: its table and key, and
// the write units' factor (2 in a transaction; 0 for a read).
type target struct {
	table  string
	key    map[string]types.AttributeValue
	factor int
	read   float64 // read units per 4 KB, for a read
}

func keyOf(item map[string]types.AttributeValue) map[string]types.AttributeValue {
	key := map[string]types.AttributeValue{ledger.AttrPK: item[ledger.AttrPK]}
	if sk, ok := item[ledger.AttrStepKey]; ok { // the steps table's sort key
		key[ledger.AttrStepKey] = sk
	}
	return key
}

// writesOf lists the items a DynamoDB request touches.
func (m *Meter) writesOf(params any) []target {
	switch in := params.(type) {
	case *dynamodb.PutItemInput:
		return []target{{table: aws.ToString(in.TableName), key: keyOf(in.Item), factor: 1}}
	case *dynamodb.UpdateItemInput:
		return []target{{table: aws.ToString(in.TableName), key: in.Key, factor: 1}}
	case *dynamodb.DeleteItemInput:
		return []target{{table: aws.ToString(in.TableName), key: in.Key, factor: 1}}
	case *dynamodb.GetItemInput:
		read := 0.5
		if aws.ToBool(in.ConsistentRead) {
			read = 1
		}
		return []target{{table: aws.ToString(in.TableName), key: in.Key, read: read}}
	case *dynamodb.TransactGetItemsInput:
		var ts []target
		for _, it := range in.TransactItems {
			if it.Get != nil {
				ts = append(ts, target{table: aws.ToString(it.Get.TableName), key: it.Get.Key, read: 2})
			}
		}
		return ts
	case *dynamodb.TransactWriteItemsInput:
		var ts []target
		for _, it := range in.TransactItems {
			switch {
			case it.Put != nil:
				ts = append(ts, target{table: aws.ToString(it.Put.TableName), key: keyOf(it.Put.Item), factor: 2})
			case it.Update != nil:
				ts = append(ts, target{table: aws.ToString(it.Update.TableName), key: it.Update.Key, factor: 2})
			case it.Delete != nil:
				ts = append(ts, target{table: aws.ToString(it.Delete.TableName), key: it.Delete.Key, factor: 2})
			case it.ConditionCheck != nil:
				ts = append(ts, target{table: aws.ToString(it.ConditionCheck.TableName), key: it.ConditionCheck.Key, factor: 2})
			}
		}
		return ts
	}
	return nil
}

// items reads each target's item as it is now.
func (m *Meter) items(ctx context.Context, ts []target) []map[string]types.AttributeValue {
	out := make([]map[string]types.AttributeValue, len(ts))
	for i, t := range ts {
		got, err := m.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(t.table), Key: t.key, ConsistentRead: aws.Bool(true)})
		if err == nil {
			out[i] = got.Item
		}
	}
	return out
}

func kb(size, per int) int { return max(1, (size+per-1)/per) }

func (m *Meter) unitsOf(ts []target, before, after []map[string]types.AttributeValue) Units {
	var u Units
	for i, t := range ts {
		if t.read > 0 {
			u.Read += t.read * float64(kb(ItemSize(before[i]), 4096))
			continue
		}
		u.Write += t.factor * kb(max(ItemSize(before[i]), ItemSize(after[i])), 1024)
		u.Index += indexWrites(before[i], after[i])
	}
	return u
}

// indexEntry is an item's byState index entry, nil when it has none.
func indexEntry(item map[string]types.AttributeValue) map[string]types.AttributeValue {
	if item == nil || item[ledger.AttrListState] == nil {
		return nil
	}
	e := map[string]types.AttributeValue{}
	for _, a := range append([]string{ledger.AttrPK, ledger.AttrListState, ledger.AttrListAt}, ledger.IndexProjection...) {
		if v, ok := item[a]; ok {
			e[a] = v
		}
	}
	return e
}

// indexWrites is the index write units of an item going from before to
// after: an entry added or removed is one write, a moved one (its keys
// changed) a removal and a put, a changed one a write.
func indexWrites(before, after map[string]types.AttributeValue) int {
	b, a := indexEntry(before), indexEntry(after)
	switch {
	case b == nil && a == nil:
		return 0
	case b == nil:
		return kb(ItemSize(a), 1024)
	case a == nil:
		return kb(ItemSize(b), 1024)
	case !reflect.DeepEqual(b[ledger.AttrListState], a[ledger.AttrListState]) || !reflect.DeepEqual(b[ledger.AttrListAt], a[ledger.AttrListAt]):
		return kb(ItemSize(b), 1024) + kb(ItemSize(a), 1024)
	case !maps.EqualFunc(b, a, func(x, y types.AttributeValue) bool { return reflect.DeepEqual(x, y) }):
		return kb(max(ItemSize(b), ItemSize(a)), 1024)
	}
	return 0
}

// countCalls adds the SQS sends and Scheduler creates among calls.
func countCalls(calls []string) (sends, schedules int) {
	for _, c := range calls {
		switch {
		case strings.HasPrefix(c, "SQS.SendMessage"):
			sends++
		case c == "Scheduler.CreateSchedule":
			schedules++
		}
	}
	return sends, schedules
}

// queryUnits are the read units of a Query or Scan (see Queries); 0 for
// any other request.
func (m *Meter) queryUnits(ctx context.Context, params any) float64 {
	var items []map[string]types.AttributeValue
	var index bool
	var consistent bool
	switch in := params.(type) {
	case *dynamodb.ScanInput:
		out, err := m.db.Scan(ctx, &dynamodb.ScanInput{
			TableName: in.TableName, IndexName: in.IndexName, ExclusiveStartKey: in.ExclusiveStartKey, Limit: in.Limit,
			ConsistentRead: in.ConsistentRead, Segment: in.Segment, TotalSegments: in.TotalSegments,
		})
		if err != nil {
			return 0
		}
		items, index, consistent = out.Items, in.IndexName != nil, aws.ToBool(in.ConsistentRead)
	case *dynamodb.QueryInput:
		names, values := usedIn(aws.ToString(in.KeyConditionExpression), in.ExpressionAttributeNames, in.ExpressionAttributeValues)
		out, err := m.db.Query(ctx, &dynamodb.QueryInput{
			TableName: in.TableName, IndexName: in.IndexName, KeyConditionExpression: in.KeyConditionExpression,
			ExpressionAttributeNames: names, ExpressionAttributeValues: values, ExclusiveStartKey: in.ExclusiveStartKey,
			Limit: in.Limit, ConsistentRead: in.ConsistentRead, ScanIndexForward: in.ScanIndexForward,
		})
		if err != nil {
			return 0
		}
		items, index, consistent = out.Items, in.IndexName != nil, aws.ToBool(in.ConsistentRead)
	default:
		return 0
	}
	size := 0
	for _, it := range items {
		if index {
			size += ItemSize(indexEntry(it)) + 100 // an index entry's overhead
		} else {
			size += ItemSize(it)
		}
	}
	per := 0.5
	if consistent {
		per = 1
	}
	return per * float64(kb(size, 4096))
}

// usedIn keeps the names and values expr uses (DynamoDB refuses unused
// ones).
func usedIn(expr string, names map[string]string, values map[string]types.AttributeValue) (map[string]string, map[string]types.AttributeValue) {
	n, v := map[string]string{}, map[string]types.AttributeValue{}
	for k, x := range names {
		if usesToken(expr, k) {
			n[k] = x
		}
	}
	for k, x := range values {
		if usesToken(expr, k) {
			v[k] = x
		}
	}
	if len(n) == 0 {
		n = nil
	}
	if len(v) == 0 {
		v = nil
	}
	return n, v
}

// usesToken reports whether expr holds the placeholder tok as a whole
// word ("#1" is not in "#10").
func usesToken(expr, tok string) bool {
	for i := 0; ; {
		j := strings.Index(expr[i:], tok)
		if j < 0 {
			return false
		}
		end := i + j + len(tok)
		if end == len(expr) || !isWordByte(expr[end]) {
			return true
		}
		i = end
	}
}

func isWordByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
