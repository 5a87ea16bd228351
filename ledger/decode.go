package ledger

import (
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// decodeRecord reads a job item into a Record, as
// attributevalue.UnmarshalMap would (TestDecodeRecordAgrees holds the two
// to the same answer on every field): the hot path's decoder. Every claim
// and every finish decodes the item DynamoDB returns; the reflective
// decoder took 6 % of a one-job batch's CPU, this one a fraction of that.
// Attributes it does not know (a key item's, a newer version's) are
// skipped; one of the wrong type is an error, as there.
func decodeRecord(item map[string]types.AttributeValue) (Record, error) {
	var r Record
	for name, av := range item {
		if _, null := av.(*types.AttributeValueMemberNULL); null {
			continue
		}
		var err error
		switch name {
		case AttrPK:
			r.PK, err = str(av)
		case AttrID:
			r.ID, err = str(av)
		case AttrKind:
			r.Kind, err = str(av)
		case AttrArgs:
			r.Args, err = str(av)
		case AttrState:
			var s string
			s, err = str(av)
			r.State = State(s)
		case AttrAttempt:
			r.Attempt, err = integer(av)
		case AttrMaxAttempts:
			r.MaxAttempts, err = integer(av)
		case AttrKeyHash:
			r.KeyHash, err = str(av)
		case AttrPolicy:
			r.Policy, err = str(av)
		case AttrCreatedAt:
			r.CreatedAt, err = num(av)
		case AttrUpdatedAt:
			r.UpdatedAt, err = num(av)
		case AttrRunAt:
			r.RunAt, err = num(av)
		case AttrDeadline:
			r.Deadline, err = num(av)
		case AttrLeaseUntil:
			r.LeaseUntil, err = num(av)
		case AttrToken:
			r.Token, err = num(av)
		case AttrLastError:
			r.LastError, err = str(av)
		case AttrResult:
			r.Result, err = str(av)
		case AttrResultBlob:
			r.ResultBlob, err = str(av)
		case AttrArgsBlob:
			r.ArgsBlob, err = str(av)
		case AttrExpiresAt:
			r.ExpiresAt, err = num(av)
		case AttrParentID:
			r.ParentID, err = str(av)
		case AttrChildren:
			r.Children, err = strs(av)
		case AttrListState:
			r.ListState, err = str(av)
		case AttrListErr:
			r.ListErr, err = str(av)
		case AttrListAt:
			r.ListAt, err = num(av)
		case AttrUndispatched:
			r.Undispatched, err = boolean(av)
		case AttrNonce:
			r.Nonce, err = str(av)
		case AttrNonce1:
			r.Nonce1, err = str(av)
		case AttrNonce2:
			r.Nonce2, err = str(av)
		case AttrHist0:
			r.Hist0, err = attempt(av)
		case AttrHist1:
			r.Hist1, err = attempt(av)
		case AttrHist2:
			r.Hist2, err = attempt(av)
		case AttrRequest:
			r.Request, err = str(av)
		case AttrRequestAt:
			r.RequestAt, err = num(av)
		case AttrCutOffs:
			r.CutOffs, err = integer(av)
		case AttrReturns:
			r.Returns, err = integer(av)
		case AttrReturnOf:
			r.ReturnOf, err = str(av)
		case AttrReturnAt:
			r.ReturnAt, err = num(av)
		case AttrArgsHash:
			r.ArgsHash, err = str(av)
		case AttrCancelled:
			r.Cancelled, err = boolean(av)
		case AttrHookPending:
			r.HookPending, err = boolean(av)
		case AttrHookUntil:
			r.HookUntil, err = num(av)
		case AttrDefers:
			r.Defers, err = integer(av)
		case AttrSlot:
			r.Slot, err = num(av)
		case AttrTicket:
			r.Ticket, err = num(av)
		case AttrParents:
			r.Parents, err = strs(av)
		case AttrReleased:
			r.Released, err = strs(av)
		case AttrQueue:
			r.Queue, err = str(av)
		case AttrSteps:
			r.Steps, err = decodeSteps(av)
		case AttrCancelReq:
			r.CancelReq, err = str(av)
		case AttrByCheck:
			r.ByCheck, err = boolean(av)
		case AttrReopenWaits:
			r.ReopenWaits, err = boolean(av)
		case AttrRan:
			r.RanMark, err = boolean(av)
		case AttrStepsGen:
			var n int64
			n, err = num(av)
			r.StepsGen = int(n)
		case AttrNonJob:
			r.NonJob, err = boolean(av)
		case AttrCaller:
			r.Caller, err = str(av)
		case AttrChildEnds:
			var n int64
			n, err = num(av)
			r.ChildEnds = int(n)
		case AttrAwaitEnd:
			r.AwaitEnd, err = num(av)
		case AttrCompensable:
			r.Compensable, err = boolean(av)
		}
		if err != nil {
			return Record{}, fmt.Errorf("attribute %q: %w", name, err)
		}
	}
	return r, nil
}

// decodeRecords decodes a page of job items with decodeRecord.
func decodeRecords(items []map[string]types.AttributeValue) ([]Record, error) {
	recs := make([]Record, 0, len(items))
	for _, item := range items {
		r, err := decodeRecord(item)
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	return recs, nil
}

func str(av types.AttributeValue) (string, error) {
	if s, ok := av.(*types.AttributeValueMemberS); ok {
		return s.Value, nil
	}
	return "", wrongType(av, "S")
}

func num(av types.AttributeValue) (int64, error) {
	if n, ok := av.(*types.AttributeValueMemberN); ok {
		return strconv.ParseInt(n.Value, 10, 64)
	}
	return 0, wrongType(av, "N")
}

func integer(av types.AttributeValue) (int, error) {
	n, err := num(av)
	return int(n), err
}

func boolean(av types.AttributeValue) (bool, error) {
	if b, ok := av.(*types.AttributeValueMemberBOOL); ok {
		return b.Value, nil
	}
	return false, wrongType(av, "BOOL")
}

func strs(av types.AttributeValue) ([]string, error) {
	if ss, ok := av.(*types.AttributeValueMemberSS); ok {
		return ss.Value, nil
	}
	var out []string // a list of strings, as UnmarshalMap takes too
	return out, attributevalue.Unmarshal(av, &out)
}

func attempt(av types.AttributeValue) (*Attempt, error) {
	var a *Attempt // rare and small: the reflective decoder is fine here
	return a, attributevalue.Unmarshal(av, &a)
}

func wrongType(av types.AttributeValue, want string) error {
	return fmt.Errorf("nexjob: want a %s value, got %T", want, av)
}
