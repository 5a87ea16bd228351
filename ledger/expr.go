package ledger

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// updateExpr is one UpdateItem's expressions (or a PutItem's condition),
// ready to send. The hot path's three writes per job (Insert's put, Claim,
// Finish) write theirs by hand: the expression builder costs about 200
// allocations an update, more than the SDK's call itself. The rarer
// writes build theirs with the builder (built).
//
// Placeholders are the attribute's name ("#state") and a label (":now");
// every name and value added must be used, as DynamoDB refuses
// unused ones.
type updateExpr struct {
	cond   string
	set    []string
	remove []string
	names  map[string]string
	values map[string]types.AttributeValue
}

func newUpdateExpr() *updateExpr {
	return &updateExpr{names: make(map[string]string, 12), values: make(map[string]types.AttributeValue, 10),
		set: make([]string, 0, 10), remove: make([]string, 0, 4)}
}

// placeholders are "#"+name of the attributes the worker's updates use,
// made once.
var placeholders = func() map[string]string {
	m := map[string]string{}
	for _, a := range []string{AttrPK, AttrID, AttrState, AttrAttempt, AttrMaxAttempts, AttrUpdatedAt, AttrRunAt,
		AttrLeaseUntil, AttrToken, AttrLastError, AttrExpiresAt, AttrListState, AttrListAt, AttrNonce, AttrCutOffs} {
		m[a] = "#" + a
	}
	return m
}()

// n is the placeholder of an attribute name.
func (e *updateExpr) n(attr string) string {
	p, ok := placeholders[attr]
	if !ok {
		p = "#" + attr
	}
	e.names[p] = attr
	return p
}

// s and i are the placeholders of a string and a number value; label
// is the placeholder (":now").
func (e *updateExpr) s(label, v string) string {
	e.values[label] = &types.AttributeValueMemberS{Value: v}
	return label
}

func (e *updateExpr) i(label string, v int64) string {
	e.values[label] = &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
	return label
}

// assign adds "SET #attr = expr".
func (e *updateExpr) assign(attr, expr string) { e.set = append(e.set, e.n(attr)+" = "+expr) }

// drop adds "REMOVE #attr".
func (e *updateExpr) drop(attr string) { e.remove = append(e.remove, e.n(attr)) }

// index keeps the byState index's keys as withIndex does.
func (e *updateExpr) index(s *Store, st State, now string) {
	if s.Indexed(st) {
		e.assign(AttrListState, e.s(":st", string(st)))
		e.assign(AttrListAt, now)
		return
	}
	e.drop(AttrListState)
	e.drop(AttrListAt)
}

func (e *updateExpr) update() string {
	var b strings.Builder
	if len(e.set) > 0 {
		b.WriteString("SET ")
		b.WriteString(strings.Join(e.set, ", "))
	}
	if len(e.remove) > 0 {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("REMOVE ")
		b.WriteString(strings.Join(e.remove, ", "))
	}
	return b.String()
}

// built is an update made with the expression builder, as an updateExpr.
type built struct {
	expr expression.Expression
}

// buildUpdate builds cond and upd with the expression builder.
func buildUpdate(cond expression.ConditionBuilder, upd expression.UpdateBuilder) (built, error) {
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return built{}, fmt.Errorf("nexjob: build update: %w", err)
	}
	return built{expr}, nil
}

// updateInput is what an UpdateItem needs of either kind of expression.
type updateInput interface {
	condition() *string
	updateExpression() *string
	attrNames() map[string]string
	attrValues() map[string]types.AttributeValue
}

func (e *updateExpr) condition() *string                          { return &e.cond }
func (e *updateExpr) updateExpression() *string                   { u := e.update(); return &u }
func (e *updateExpr) attrNames() map[string]string                { return e.names }
func (e *updateExpr) attrValues() map[string]types.AttributeValue { return e.values }
func (b built) condition() *string                                { return b.expr.Condition() }
func (b built) updateExpression() *string                         { return b.expr.Update() }
func (b built) attrNames() map[string]string                      { return b.expr.Names() }
func (b built) attrValues() map[string]types.AttributeValue       { return b.expr.Values() }
