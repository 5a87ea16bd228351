package ledger

import (
	"strconv"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// encodeRecord writes a Record as the job item attributevalue.MarshalMap
// would (TestEncodeRecordAgrees holds the two to the same item for every
// field): the hot path's encoder, as decodeRecord is its decoder. Every
// enqueue puts one item; the reflective encoder was a quarter of a keyed
// enqueue's own (non-SDK) CPU.
func encodeRecord(r *Record) map[string]types.AttributeValue {
	item := make(map[string]types.AttributeValue, 16) // a new keyed job's
	e := itemEncoder(item)
	e.s(AttrPK, r.PK, false)
	e.s(AttrID, r.ID, false)
	e.s(AttrKind, r.Kind, false)
	e.s(AttrArgs, r.Args, false)
	e.s(AttrState, string(r.State), false)
	e.n(AttrAttempt, int64(r.Attempt), false)
	e.n(AttrMaxAttempts, int64(r.MaxAttempts), false)
	e.s(AttrKeyHash, r.KeyHash, true)
	e.s(AttrPolicy, r.Policy, true)
	e.n(AttrCreatedAt, r.CreatedAt, false)
	e.n(AttrUpdatedAt, r.UpdatedAt, false)
	e.n(AttrRunAt, r.RunAt, true)
	e.n(AttrDeadline, r.Deadline, true)
	e.n(AttrLeaseUntil, r.LeaseUntil, true)
	e.n(AttrToken, r.Token, false)
	e.s(AttrLastError, r.LastError, true)
	e.s(AttrResult, r.Result, true)
	e.s(AttrResultBlob, r.ResultBlob, true)
	e.s(AttrArgsBlob, r.ArgsBlob, true)
	e.n(AttrExpiresAt, r.ExpiresAt, true)
	e.s(AttrParentID, r.ParentID, true)
	e.ss(AttrChildren, r.Children)
	e.s(AttrListState, r.ListState, true)
	e.s(AttrListErr, r.ListErr, true)
	e.n(AttrListAt, r.ListAt, true)
	e.b(AttrUndispatched, r.Undispatched)
	e.s(AttrNonce, r.Nonce, true)
	e.s(AttrNonce1, r.Nonce1, true)
	e.s(AttrNonce2, r.Nonce2, true)
	e.attempt(AttrHist0, r.Hist0)
	e.attempt(AttrHist1, r.Hist1)
	e.attempt(AttrHist2, r.Hist2)
	e.s(AttrRequest, r.Request, true)
	e.n(AttrRequestAt, r.RequestAt, true)
	e.n(AttrCutOffs, int64(r.CutOffs), true)
	e.n(AttrReturns, int64(r.Returns), true)
	e.s(AttrReturnOf, r.ReturnOf, true)
	e.n(AttrReturnAt, r.ReturnAt, true)
	e.s(AttrArgsHash, r.ArgsHash, true)
	e.b(AttrCancelled, r.Cancelled)
	e.b(AttrHookPending, r.HookPending)
	e.n(AttrHookUntil, r.HookUntil, true)
	e.n(AttrDefers, int64(r.Defers), true)
	e.n(AttrSlot, r.Slot, true)
	e.n(AttrTicket, r.Ticket, true)
	e.ss(AttrParents, r.Parents)
	e.ss(AttrReleased, r.Released)
	e.b(AttrByCheck, r.ByCheck)
	e.b(AttrNonJob, r.NonJob)
	e.s(AttrQueue, r.Queue, true)
	e.s(AttrCancelReq, r.CancelReq, true)
	e.b(AttrReopenWaits, r.ReopenWaits)
	e.n(AttrStepsGen, int64(r.StepsGen), true)
	e.b(AttrRan, r.RanMark)
	e.s(AttrCaller, r.Caller, true)
	e.n(AttrChildEnds, int64(r.ChildEnds), true)
	e.n(AttrAwaitEnd, r.AwaitEnd, true)
	e.b(AttrCompensable, r.Compensable)
	if len(r.Steps) > 0 {
		m := make(map[string]types.AttributeValue, len(r.Steps))
		for k, v := range r.Steps {
			m[stepKey(k)] = &types.AttributeValueMemberS{Value: v}
		}
		item[AttrSteps] = &types.AttributeValueMemberM{Value: m}
	}
	return item
}

// itemEncoder adds attributes to an item as the reflective encoder does
// with its default options: omitempty drops an empty string, a zero
// number and a false; an empty string set is dropped either way.
type itemEncoder map[string]types.AttributeValue

func (e itemEncoder) s(name, v string, omitEmpty bool) {
	if v != "" || !omitEmpty {
		e[name] = &types.AttributeValueMemberS{Value: v}
	}
}

func (e itemEncoder) n(name string, v int64, omitEmpty bool) {
	if v != 0 || !omitEmpty {
		e[name] = &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
	}
}

func (e itemEncoder) b(name string, v bool) {
	if v {
		e[name] = &types.AttributeValueMemberBOOL{Value: true}
	}
}

func (e itemEncoder) ss(name string, v []string) {
	if len(v) > 0 {
		e[name] = &types.AttributeValueMemberSS{Value: v}
	}
}

func (e itemEncoder) attempt(name string, a *Attempt) {
	if a == nil {
		return
	}
	m := make(itemEncoder, 4)
	m.n("n", int64(a.N), false)
	m.n("at", a.At, false)
	m.s("st", string(a.State), false)
	m.s("err", a.Error, true)
	e[name] = &types.AttributeValueMemberM{Value: m}
}
