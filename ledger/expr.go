package ledger

import (
	"fmt"
	"strconv"
	"strings"
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
type writeExpr struct {
	cond   string
	set    strings.Builder // "SET #a = :x, #b = :y": the SET clause (update appends the REMOVE clause to it)
	remove strings.Builder // "#c, #d"
	names  map[string]string
	values map[string]types.AttributeValue
}

// newWriteExpr is an update's expressions, sized by the caller for its
// names and values (a map that grows mid-write copies itself; one sized
// far over its use costs its empty slots) and for its update expression
// (one allocation when it fits).
func newWriteExpr(names, values, size int) *writeExpr {
	e := &writeExpr{names: make(map[string]string, names), values: make(map[string]types.AttributeValue, values)}
	e.set.Grow(size)
	return e
}

// newCondExpr is a put's condition: a few names and values, no clauses.
func newCondExpr() *writeExpr {
	return &writeExpr{names: make(map[string]string, 4), values: make(map[string]types.AttributeValue, 4)}
}

// placeholders are "#"+name of the attributes the worker's updates use,
// made once.
var placeholders = func() map[string]string {
	m := map[string]string{}
	for _, a := range []string{AttrPK, AttrID, AttrState, AttrAttempt, AttrMaxAttempts, AttrUpdatedAt, AttrRunAt,
		AttrLeaseUntil, AttrToken, AttrLastError, AttrExpiresAt, AttrListState, AttrListAt, AttrListErr, AttrNonce, AttrNonce1, AttrNonce2, AttrHist0, AttrHist1, AttrHist2, AttrCutOffs} {
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
	e.names[p] = attr
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

// assign adds "SET #attr = expr", expr given in pieces (written as they
// are, no string built for it).
func (e *writeExpr) assign(attr string, expr ...string) {
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
	none := e.s(":noNonce", noNonce)
	e.assign(AttrNonce2, "if_not_exists(", e.n(AttrNonce1), ", ", none, ")")
	e.assign(AttrNonce1, "if_not_exists(", e.n(AttrNonce), ", ", none, ")")
	e.assign(AttrNonce, e.s(":nonce", nonce))
}

// history shifts the run ends down and sets a as the newest (the
// operands read the item as it was before this update).
func (e *writeExpr) history(a Attempt) {
	none := ":noHist"
	e.values[none] = &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{}}
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

// absent is the condition that the item does not exist yet.
func absent() *writeExpr {
	e := newCondExpr()
	e.cond = "attribute_not_exists(" + e.n(AttrPK) + ")"
	return e
}

// keyFree is the condition under which a key's record may be overwritten
// without a look: it does not exist, or it is past its retention.
func keyFree(now time.Time) *writeExpr {
	e := absent()
	e.cond += " OR " + e.n(AttrExpiresAt) + " <= " + e.i(":now", now.Unix())
	return e
}

// replaceable is keyFree, or: the record ended in one of states, holds no
// continuations and was not made by request (when there is one).
func replaceable(now time.Time, states []State, request string) *writeExpr {
	e := keyFree(now)
	if len(states) == 0 {
		return e
	}
	in := make([]string, len(states))
	for i, st := range states {
		in[i] = e.s(":ended"+strconv.Itoa(i), string(st))
	}
	ended := e.n(AttrState) + " IN (" + strings.Join(in, ", ") + ") AND attribute_not_exists(" + e.n(AttrChildren) + ")"
	if request != "" {
		r := e.n(AttrRequest)
		ended += " AND (attribute_not_exists(" + r + ") OR " + r + " <> " + e.s(":request", request) + ")"
	}
	e.cond = "(" + e.cond + ") OR (" + ended + ")"
	return e
}

// exprs are a write's expressions as its request carries them.
type exprs struct {
	cond, update *string // update is nil for a Put
	names        map[string]string
	values       map[string]types.AttributeValue // nil when none: DynamoDB refuses an empty map
}

func (e *writeExpr) exprs() exprs {
	out := exprs{cond: &e.cond, names: e.names}
	if len(e.values) > 0 {
		out.values = e.values
	}
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
