package ledger

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// writeExpr is one write's expressions, written by hand: an UpdateItem's
// condition and update, or a Put's condition. The hot path's three writes
// per job (Insert's put, Claim, Finish) use it: the expression builder
// costs about 200 allocations an update, more than the SDK's call itself.
// The rarer updates build theirs with the builder (buildUpdate).
//
// Placeholders are the attribute's name ("#state") and a label (":now");
// every name and value added must be used, as DynamoDB refuses
// unused ones.
//
// Claim, Finish and the puts' conditions keep the text of their writes
// (shapes): a write whose shape was seen before only collects its values
// (known is set, and assign, drop and the caller's condition write
// nothing).
type writeExpr struct {
	cond   string
	set    strings.Builder // "SET #a = :x, #b = :y": the SET clause (update appends the REMOVE clause to it)
	remove strings.Builder // "#c, #d"
	names  map[string]string
	values map[string]types.AttributeValue
	known  *shape // the text and names, when this write's shape was seen before
	pooled bool   // values is valueMaps'
}

// writing reports whether e writes its text (its shape is new): a caller
// writes its condition only then.
func (e *writeExpr) writing() bool { return e.known == nil }

// shape is what every write of one shape has in common: the condition's
// and the update's text and the attribute names. Once kept it is only
// read (by the SDK's serialiser, by any number of writes at once).
type shape struct {
	cond, update string
	names        map[string]string
}

// shapes keeps one call site's write shapes, keyed by the branches that
// decide its text (never by a value). Reading takes no lock: the map is
// replaced, not changed, when a shape is added (a call site has a few
// dozen at most).
type shapes[K comparable] struct {
	mu sync.Mutex
	m  atomic.Pointer[map[K]*shape]
}

// start is the write of shape k, sized by the caller for its names and
// values (a map that grows mid-write copies itself; one sized far over
// its use costs its empty slots) and for its update expression (one
// allocation when it fits). It writes only its values when k was seen
// before.
func (c *shapes[K]) start(k K, names, values, size int) *writeExpr {
	var e *writeExpr
	if m := c.m.Load(); m != nil {
		if sh := (*m)[k]; sh != nil {
			e = &writeExpr{known: sh}
		}
	}
	if e == nil {
		e = &writeExpr{names: make(map[string]string, names)}
		e.set.Grow(size)
	}
	if values > smallMap {
		e.values, e.pooled = valueMaps.Get().(map[string]types.AttributeValue), true
	} else {
		e.values = make(map[string]types.AttributeValue, values)
	}
	return e
}

// smallMap is the most entries a map holds without a table of its own
// (Go's maps keep up to 8 in one group); a write's values map larger than
// that is taken from valueMaps and given back by exprs.release.
const smallMap = 8

var valueMaps = sync.Pool{New: func() any { return make(map[string]types.AttributeValue, 2*smallMap) }}

// release gives x's values map back for another write. Only a caller
// whose request is over may call it: the map is cleared.
func (x exprs) release() {
	if x.pooled {
		clear(x.values)
		valueMaps.Put(x.values)
	}
}

// end is e's expressions; a new shape is kept as k's.
func (c *shapes[K]) end(k K, e *writeExpr) exprs {
	out := e.exprs()
	if e.known != nil {
		return out
	}
	sh := &shape{cond: e.cond, names: e.names}
	if out.update != nil {
		sh.update = *out.update
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	next := map[K]*shape{k: sh}
	if old := c.m.Load(); old != nil {
		maps.Copy(next, *old)
	}
	c.m.Store(&next)
	return out
}

// placeholders are "#"+name of the attributes the worker's updates use,
// made once.
var placeholders = func() map[string]string {
	m := map[string]string{}
	for _, a := range []string{AttrPK, AttrID, AttrState, AttrAttempt, AttrMaxAttempts, AttrUpdatedAt, AttrRunAt,
		AttrLeaseUntil, AttrToken, AttrLastError, AttrExpiresAt, AttrListState, AttrListAt, AttrListErr, AttrNonce, AttrNonce1, AttrNonce2, AttrHist0, AttrHist1, AttrHist2, AttrCutOffs,
		AttrDefers, AttrSlot, AttrTicket, AttrHookPending, AttrHookUntil, AttrByCheck} {
		m[a] = "#" + a
	}
	return m
}()

// n is the placeholder of an attribute name.
func (e *writeExpr) n(attr string) string {
	p, ok := placeholders[attr]
	if !ok {
		p = "#" + attr
	}
	if e.known == nil {
		e.names[p] = attr
	}
	return p
}

// s and i are the placeholders of a string and a number value; label
// is the placeholder (":now").
func (e *writeExpr) s(label, v string) string {
	e.values[label] = &types.AttributeValueMemberS{Value: v}
	return label
}

func (e *writeExpr) i(label string, v int64) string {
	e.values[label] = &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
	return label
}

// c is the placeholder of a constant value (one of the shared ones
// below, which no one writes to).
func (e *writeExpr) c(label string, v types.AttributeValue) string {
	e.values[label] = v
	return label
}

// The values every claim and finish writes, made once: the SDK only
// reads a request's values.
var (
	oneV      types.AttributeValue = &types.AttributeValueMemberN{Value: "1"}
	zeroV     types.AttributeValue = &types.AttributeValueMemberN{Value: "0"}
	noNonceV  types.AttributeValue = &types.AttributeValueMemberS{Value: noNonce}
	noHistV   types.AttributeValue = &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{}}
	stateVals                      = func() map[State]types.AttributeValue {
		m := map[State]types.AttributeValue{}
		for _, st := range []State{Enqueued, Scheduled, Processing, AwaitingContinuation, Succeeded, Failed, Expired} {
			m[st] = &types.AttributeValueMemberS{Value: string(st)}
		}
		return m
	}()
)

// state is the placeholder of a state's value.
func (e *writeExpr) state(label string, st State) string {
	if v, ok := stateVals[st]; ok {
		return e.c(label, v)
	}
	return e.s(label, string(st))
}

// assign adds "SET #attr = expr", expr given in pieces (written as they
// are, no string built for it).
func (e *writeExpr) assign(attr string, expr ...string) {
	if e.known != nil {
		return
	}
	if e.set.Len() > 0 {
		e.set.WriteString(", ")
	} else {
		e.set.WriteString("SET ")
	}
	e.set.WriteString(e.n(attr))
	e.set.WriteString(" = ")
	for _, x := range expr {
		e.set.WriteString(x)
	}
}

// stamp sets the write's nonce and shifts the two before it down (the
// operands read the item as it was before this update).
func (e *writeExpr) stamp(nonce string) {
	none := e.c(":noNonce", noNonceV)
	e.assign(AttrNonce2, "if_not_exists(", e.n(AttrNonce1), ", ", none, ")")
	e.assign(AttrNonce1, "if_not_exists(", e.n(AttrNonce), ", ", none, ")")
	e.assign(AttrNonce, e.s(":nonce", nonce))
}

// history shifts the run ends down and sets a as the newest (the
// operands read the item as it was before this update).
func (e *writeExpr) history(a Attempt) {
	none := e.c(":noHist", noHistV)
	e.assign(AttrHist2, "if_not_exists(", e.n(AttrHist1), ", ", none, ")")
	e.assign(AttrHist1, "if_not_exists(", e.n(AttrHist0), ", ", none, ")")
	m := map[string]types.AttributeValue{
		"n":  &types.AttributeValueMemberN{Value: strconv.Itoa(a.N)},
		"at": &types.AttributeValueMemberN{Value: strconv.FormatInt(a.At, 10)},
		"st": &types.AttributeValueMemberS{Value: string(a.State)},
	}
	if a.Error != "" {
		m["err"] = &types.AttributeValueMemberS{Value: a.Error}
	}
	e.values[":hist"] = &types.AttributeValueMemberM{Value: m}
	e.assign(AttrHist0, ":hist")
}

// stampBuilder is stamp for an update made with the expression builder.
func stampBuilder(upd expression.UpdateBuilder, nonce string) expression.UpdateBuilder {
	none := expression.Value(noNonce)
	return upd.Set(expression.Name(AttrNonce2), expression.IfNotExists(expression.Name(AttrNonce1), none)).
		Set(expression.Name(AttrNonce1), expression.IfNotExists(expression.Name(AttrNonce), none)).
		Set(expression.Name(AttrNonce), expression.Value(nonce))
}

// drop adds "REMOVE #attr".
func (e *writeExpr) drop(attr string) {
	if e.known != nil {
		return
	}
	if e.remove.Len() > 0 {
		e.remove.WriteString(", ")
	}
	e.remove.WriteString(e.n(attr))
}

// index keeps the byState index's keys as withIndex does for job id; now
// is the placeholder of the time.
func (e *writeExpr) index(s *Store, st State, id, now string) {
	if s.Indexed(st) {
		e.assign(AttrListState, e.s(":listKey", s.listKey(st, id)))
		e.assign(AttrListAt, now)
		return
	}
	e.drop(AttrListState)
	e.drop(AttrListAt)
}

// update is the update expression; it ends the writing of e (the REMOVE
// clause goes into the SET clause's builder, so that the expression is
// not copied again).
func (e *writeExpr) update() string {
	switch {
	case e.remove.Len() == 0:
		return e.set.String()
	case e.set.Len() == 0:
		return "REMOVE " + e.remove.String()
	}
	e.set.WriteString(" REMOVE ")
	e.set.WriteString(e.remove.String())
	e.remove.Reset()
	return e.set.String()
}

// putShape decides the text of a put's condition.
type putShape struct {
	free    bool // or the record is past its retention
	ended   int  // or it ended in one of this many states (and holds no continuations, and no hook is due)
	request bool // and (ended) was not made by the request
	ordered bool // and (request) was made by an earlier request (RequestAt: the key's requests only increase)
}

// puts keeps the text of puts' conditions (which depends on nothing of a
// Store's).
var puts shapes[putShape]

// endedLabels are the placeholders of replaceable's states.
var endedLabels = [...]string{":ended0", ":ended1", ":ended2", ":ended3", ":ended4", ":ended5", ":ended6"}

// putCond is a put's condition of shape k, kept in c.
func putCond(c *shapes[putShape], k putShape, now time.Time, states []State, request string, requestAt int64) exprs {
	e := c.start(k, 6, 2+len(states), 0)
	pk := e.n(AttrPK)
	var nowv, req string
	if k.free {
		nowv = e.i(":now", now.Unix())
	}
	for i, st := range states {
		e.state(endedLabels[i], st)
	}
	var reqAt string
	if k.request {
		req = e.s(":request", request)
	}
	if k.ordered {
		reqAt = e.i(":reqAt", requestAt)
	}
	if e.writing() {
		e.cond = "attribute_not_exists(" + pk + ")"
		if k.free {
			e.cond += " OR " + e.n(AttrExpiresAt) + " <= " + nowv
		}
		if k.ended > 0 {
			// A record whose dead-letter hook is still due is not
			// overwritten: its hook would never run.
			ended := e.n(AttrState) + " IN (" + strings.Join(endedLabels[:k.ended], ", ") + ") AND attribute_not_exists(" + e.n(AttrChildren) + ")" +
				" AND attribute_not_exists(" + e.n(AttrHookPending) + ")"
			if k.request {
				r := e.n(AttrRequest)
				ended += " AND (attribute_not_exists(" + r + ") OR " + r + " <> " + req + ")"
			}
			if k.ordered {
				r := e.n(AttrRequestAt)
				ended += " AND (attribute_not_exists(" + r + ") OR " + r + " < " + reqAt + ")"
			}
			e.cond = "(" + e.cond + ") OR (" + ended + ")"
		}
	}
	return c.end(k, e)
}

// absent is the condition that the item does not exist yet.
func absent() exprs { return putCond(&puts, putShape{}, time.Time{}, nil, "", 0) }

// keyFree is the condition under which a key's record may be overwritten
// without a look: it does not exist, or it is past its retention.
func keyFree(now time.Time) exprs { return putCond(&puts, putShape{free: true}, now, nil, "", 0) }

// replaceable is keyFree, or: the record ended in one of states, holds no
// continuations and no due hook, and was not made by request (when there
// is one; with requestAt, by a request before it).
func replaceable(now time.Time, states []State, request string, requestAt int64) exprs {
	k := putShape{free: true, ended: len(states), request: request != "" && len(states) > 0}
	k.ordered = k.request && requestAt > 0
	return putCond(&puts, k, now, states, request, requestAt)
}

// exprs are a write's expressions as its request carries them.
type exprs struct {
	cond, update *string // update is nil for a Put
	names        map[string]string
	values       map[string]types.AttributeValue // nil when none: DynamoDB refuses an empty map
	pooled       bool                            // values goes back to valueMaps (release)
}

func (e *writeExpr) exprs() exprs {
	out := exprs{pooled: e.pooled}
	if len(e.values) > 0 {
		out.values = e.values
	}
	if k := e.known; k != nil {
		out.cond, out.names = &k.cond, k.names
		if k.update != "" {
			out.update = &k.update
		}
		return out
	}
	out.cond, out.names = &e.cond, e.names
	if u := e.update(); u != "" {
		out.update = &u
	}
	return out
}

// buildUpdate builds cond and upd with the expression builder.
func buildUpdate(cond expression.ConditionBuilder, upd expression.UpdateBuilder) (exprs, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return exprs{}, fmt.Errorf("nexjob: build update: %w", err)
	}
	return exprs{cond: expr.Condition(), update: expr.Update(), names: expr.Names(), values: expr.Values()}, nil
}
