// Package powertools keeps idempotent calls' records in the layout of
// Powertools for AWS Lambda's DynamoDB persistence layer, so that a Go
// function using package idempotency and a Python or TypeScript function
// using Powertools share one table and one key space: a key one of them
// ran is replayed to the other, and a key held by one is in progress for
// the other.
//
//	b, err := powertools.New(cfg, &powertools.Options{Table: "IdempotencyTable", KeyPrefix: "payments"})
//	s, err := idempotency.New(cfg, "", &idempotency.Options{Backend: b})
//
// The records are Powertools' own: partition key "id" (KeyAttr; or
// StaticPKValue under KeyAttr and the id under SortKeyAttr), "status"
// (INPROGRESS, COMPLETED), "expiration" (unix seconds, the table's TTL),
// "in_progress_expiration" (unix ms; on a Go hold its end plus
// MaxClockSkew, which Powertools does not allow for), "data" (the result) and
// "validation" (the payload's hash). The id is "<KeyPrefix>#<hash>",
// where the hash is Powertools' of the key's JSON: MD5 in hex of Python's
// json.dumps(key, sort_keys=True) (Dialect Python), or MD5 in base64 of
// JSON.stringify(deepSort(key)) (Dialect TypeScript); a Python and a
// TypeScript function hash apart, so share keys with one of them. Give
// the Powertools side the same prefix (Python: key_prefix="payments";
// TypeScript: keyPrefix: 'payments'): its default prefix, the function's
// name and the handler's, cannot be known from Go. A key passed to Do is
// a JSON string, as the Powertools side's key is when its event key path
// selects a string; an event's KeyPath value is hashed as its JSON.
//
// What differs from the Store's own records, and why: keys are hashed
// with Powertools' unkeyed MD5 (the layout needs it; the Store's logs and
// errors then carry "<prefix>#<md5>", which for a guessable key is the
// key), not the deployment's key secret. Only RejectAlways and no
// RecordErrors exist in Powertools' layout (a COMPLETED record is always
// replayed; an error deletes the record): New of a Store with another
// policy or RecordErrors fails with *idempotency.LayoutError. Each record
// the Go side writes also carries "nexjob_token", its writer's token,
// which the Powertools side ignores: the Go side's result write and its
// release are conditional on it (Powertools' own are not), so a late Go
// call never overwrites a key another call took over. A Python float
// with an integral value (5.0) in a key or payload hashes as Python
// writes it only when given as Do's string key; an event's number is
// read as package idempotency reads it (5.0 as 5).
//
// The nexjob table can hold them too: give both sides its key and TTL
// attributes (KeyAttr "pk", ExpiryAttr "expiresAt"; Python key_attr="pk",
// expiry_attr="expiresAt"): their items have no "state", so no listing,
// index or stream consumer of jobs sees them, and a KeyPrefix of more
// than one character never meets the table's own ("j#…", "k#…").
//
// Costs are Powertools': a first call is a PutItem (the hold, 1 write
// unit) and an UpdateItem (1 unit per started KB of the record), a repeat
// one PutItem whose failed condition returns the record (billed at the
// record's size), a call whose function fails a PutItem and a DeleteItem
// (TestPowertoolsCallCosts pins them).
package powertools

import (
	"context"
	"crypto/md5" //nolint:gosec // Powertools' key hash: the layout, not a secret
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/nexjob/nexjob-aws/idempotency"
	"github.com/nexjob/nexjob-aws/ledger"
)

// Dialect is whose hashes and data the records hold.
type Dialect int

const (
	// Python: Powertools for AWS Lambda (Python): MD5 hex of json.dumps
	// with sorted keys; "data" the result's JSON as a string.
	Python Dialect = iota
	// TypeScript: Powertools for AWS Lambda (TypeScript): MD5 base64 of
	// JSON.stringify(deepSort(…)); "data" the result as a DynamoDB value.
	TypeScript
)

// Options say where the records are and how they are named. Table and
// KeyPrefix are required; every attribute name defaults to Powertools'.
type Options struct {
	Table string
	// KeyPrefix begins each record's id, "<KeyPrefix>#<hash>": the
	// Powertools side's key_prefix (keyPrefix). It must not hold "#".
	KeyPrefix string
	Dialect   Dialect

	KeyAttr              string // "id"
	SortKeyAttr          string // none; when set, KeyAttr holds StaticPKValue and SortKeyAttr the id
	StaticPKValue        string // "idempotency#" + AWS_LAMBDA_FUNCTION_NAME, as Powertools'
	ExpiryAttr           string // "expiration"
	InProgressExpiryAttr string // "in_progress_expiration"
	StatusAttr           string // "status"
	DataAttr             string // "data"
	ValidationAttr       string // "validation"

	// DynamoDB is the client. Defaults to one from the config.
	DynamoDB ledger.DynamoDB
	// Now is the clock holds and expiry are decided by. Defaults to
	// time.Now.
	Now func() time.Time
}

// Attributes only the Go side writes (Powertools ignores them).
const (
	// TokenAttr holds the Go writer's token on the records it writes.
	TokenAttr = "nexjob_token"
	// UntilAttr holds a Go hold's end (unix ms); its in-progress expiry,
	// which Powertools reads, is that plus MaxClockSkew.
	UntilAttr = "nexjob_until"
	// MarkAttr says a completed call's result was not kept (over
	// MaxResultBytes, or no JSON): Powertools replays such a record as
	// null.
	MarkAttr = "nexjob_mark"
)

// Powertools' statuses.
const (
	statusInProgress = "INPROGRESS"
	statusCompleted  = "COMPLETED"
)

// Backend is an idempotency.Backend and idempotency.Layout on a
// Powertools table. It is safe for concurrent use.
type Backend struct {
	o  Options
	db ledger.DynamoDB
}

var (
	_ idempotency.Backend = (*Backend)(nil)
	_ idempotency.Layout  = (*Backend)(nil)
)

// New returns a Backend on the table opts names.
func New(cfg aws.Config, opts *Options) (*Backend, error) {
	if opts == nil || opts.Table == "" || opts.KeyPrefix == "" {
		return nil, errors.New("nexjob: powertools: Options.Table and Options.KeyPrefix are required")
	}
	o := *opts
	switch {
	case strings.Contains(o.KeyPrefix, "#"):
		return nil, fmt.Errorf("nexjob: powertools: KeyPrefix %q holds \"#\", which ends it in a record's id", o.KeyPrefix)
	case len(o.KeyPrefix) == 1:
		return nil, fmt.Errorf("nexjob: powertools: KeyPrefix %q is one character: the nexjob table's own items begin with one letter and \"#\"", o.KeyPrefix)
	}
	if o.Dialect != Python && o.Dialect != TypeScript {
		return nil, fmt.Errorf("nexjob: powertools: unknown Dialect %d", int(o.Dialect))
	}
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&o.KeyAttr, "id")
	def(&o.ExpiryAttr, "expiration")
	def(&o.InProgressExpiryAttr, "in_progress_expiration")
	def(&o.StatusAttr, "status")
	def(&o.DataAttr, "data")
	def(&o.ValidationAttr, "validation")
	if o.SortKeyAttr != "" {
		def(&o.StaticPKValue, "idempotency#"+lambdaFunctionName())
		if o.SortKeyAttr == o.KeyAttr {
			return nil, fmt.Errorf("nexjob: powertools: KeyAttr and SortKeyAttr are both %q", o.KeyAttr)
		}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	db := o.DynamoDB
	if db == nil {
		db = dynamodb.NewFromConfig(cfg)
	}
	return &Backend{o: o, db: db}, nil
}

// CallKey is idempotency.Layout's: "<KeyPrefix>#<hash of the key's JSON>".
func (b *Backend) CallKey(keyJSON []byte) (string, error) {
	h, err := b.hash(keyJSON)
	if err != nil {
		return "", err
	}
	return b.o.KeyPrefix + "#" + h, nil
}

// PayloadHash is idempotency.Layout's: Powertools' hash of the payload.
func (b *Backend) PayloadHash(payloadJSON []byte) (string, error) { return b.hash(payloadJSON) }

// Supports is idempotency.Layout's: Powertools replays every COMPLETED
// record and keeps no error.
func (b *Backend) Supports(policy ledger.DuplicatePolicy, recordErrors bool) error {
	switch {
	case policy != ledger.RejectAlways:
		return errors.New("the Powertools layout replays every completed record: only RejectAlways")
	case recordErrors:
		return errors.New("the Powertools layout keeps no error (an error deletes the record): RecordErrors is not possible")
	}
	return nil
}

func (b *Backend) hash(doc []byte) (string, error) {
	v, err := ordered(doc)
	if err != nil {
		return "", fmt.Errorf("nexjob: powertools: %w", err)
	}
	var w strings.Builder
	if b.o.Dialect == TypeScript {
		jsJSON(&w, v)
		sum := md5.Sum([]byte(w.String())) //nolint:gosec // the layout's hash
		return base64.StdEncoding.EncodeToString(sum[:]), nil
	}
	pythonJSON(&w, v)
	sum := md5.Sum([]byte(w.String())) //nolint:gosec // the layout's hash
	return hex.EncodeToString(sum[:]), nil
}

// key is a record's primary key.
func (b *Backend) key(id string) map[string]types.AttributeValue {
	if b.o.SortKeyAttr != "" {
		return map[string]types.AttributeValue{b.o.KeyAttr: &types.AttributeValueMemberS{Value: b.o.StaticPKValue}, b.o.SortKeyAttr: &types.AttributeValueMemberS{Value: id}}
	}
	return map[string]types.AttributeValue{b.o.KeyAttr: &types.AttributeValueMemberS{Value: id}}
}

// BeginCall is idempotency.Backend's: Powertools' conditional PutItem
// (the key free when absent, expired, or in progress past its in-progress
// expiry less skew), the failed condition returning the holder.
func (b *Backend) BeginCall(ctx context.Context, keyHash, payloadHash string, policy ledger.DuplicatePolicy, until time.Time, skew, retention time.Duration) (ledger.Call, bool, error) {
	if err := b.Supports(policy, false); err != nil {
		return ledger.Call{}, false, err
	}
	c, err := ledger.NewCall(keyHash, payloadHash, policy, until, retention)
	if err != nil {
		return ledger.Call{}, false, err
	}
	item := b.key(keyHash)
	item[b.o.StatusAttr] = &types.AttributeValueMemberS{Value: statusInProgress}
	item[b.o.ExpiryAttr] = number(c.ExpiresAt.Unix())
	// Powertools takes a hold once its in-progress expiry is behind its
	// clock, allowing for no skew: it is given the hold's end plus
	// MaxClockSkew, so that a Powertools host whose clock is ahead by less
	// never takes a key a Go call holds. The Go side reads the hold's own
	// end (UntilAttr).
	item[b.o.InProgressExpiryAttr] = number(ledger.CeilMillis(c.Until.Add(skew)).UnixMilli())
	item[UntilAttr] = number(c.Until.UnixMilli())
	item[TokenAttr] = &types.AttributeValueMemberS{Value: c.Token}
	if payloadHash != "" {
		item[b.o.ValidationAttr] = &types.AttributeValueMemberS{Value: payloadHash}
	}
	now := b.o.Now()
	id := b.idAttr()
	// Free: no record, an expired one, or a hold whose end is more than
	// skew behind our clock: a Go hold's own end (UntilAttr), else a
	// Powertools hold's in-progress expiry (none: held to its expiry).
	behind := expression.Value(now.Add(-skew).UnixMilli())
	goHold := expression.AttributeExists(expression.Name(UntilAttr)).And(expression.Name(UntilAttr).LessThan(behind))
	ptHold := expression.AttributeNotExists(expression.Name(UntilAttr)).
		And(expression.AttributeExists(expression.Name(b.o.InProgressExpiryAttr))).
		And(expression.Name(b.o.InProgressExpiryAttr).LessThan(behind))
	free := expression.AttributeNotExists(expression.Name(id)).
		Or(expression.Name(b.o.ExpiryAttr).LessThan(expression.Value(now.Unix()))).
		Or(expression.Name(b.o.StatusAttr).Equal(expression.Value(statusInProgress)).And(goHold.Or(ptHold)))
	x, err := expression.NewBuilder().WithCondition(free).Build()
	if err != nil {
		return ledger.Call{}, false, fmt.Errorf("nexjob: powertools: build the hold's condition: %w", err)
	}
	_, err = b.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(b.o.Table), Item: item,
		ConditionExpression: x.Condition(), ExpressionAttributeNames: x.Names(), ExpressionAttributeValues: x.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return c, true, nil
	case errors.As(err, &ccf):
		old, derr := b.decode(keyHash, ccf.Item)
		if derr != nil {
			return ledger.Call{}, false, derr
		}
		return old, old.Token == c.Token, nil // our own put, applied, its reply lost
	case b.refused(err) != nil:
		return ledger.Call{}, false, b.refused(err)
	case !ledger.OutcomeUnknown(err):
		return ledger.Call{}, false, fmt.Errorf("nexjob: powertools: hold %s in %s: %w", keyHash, b.o.Table, err)
	}
	if cur, ok, rerr := b.GetCall(ctx, keyHash); rerr == nil && ok {
		return cur, cur.Token == c.Token, nil
	}
	return ledger.Call{}, false, &ledger.UnknownOutcomeError{ID: keyHash, Err: fmt.Errorf("nexjob: powertools: hold in %s: %w", b.o.Table, err), Nonce: c.Token}
}

// idAttr is the attribute holding a record's id.
func (b *Backend) idAttr() string {
	if b.o.SortKeyAttr != "" {
		return b.o.SortKeyAttr
	}
	return b.o.KeyAttr
}

// RecordCall is idempotency.Backend's: Powertools' UpdateItem to
// COMPLETED with the result, conditional on the hold being the caller's.
func (b *Backend) RecordCall(ctx context.Context, held ledger.Call, state ledger.State, result []byte, errText string, expiresAt time.Time) (ledger.Call, error) {
	if state != ledger.Succeeded {
		return ledger.Call{}, errors.New("nexjob: powertools: the layout keeps no error (RecordErrors is not possible)")
	}
	out, err := held.Outcome(state, result, errText, expiresAt)
	if err != nil {
		return ledger.Call{}, err
	}
	upd := expression.Set(expression.Name(b.o.StatusAttr), expression.Value(statusCompleted)).
		Set(expression.Name(b.o.ExpiryAttr), expression.Value(out.ExpiresAt.Unix())).
		Set(expression.Name(TokenAttr), expression.Value(out.Token))
	if len(result) > 0 {
		data, err := b.data(result)
		if err != nil {
			return ledger.Call{}, err
		}
		upd = upd.Set(expression.Name(b.o.DataAttr), expression.Value(data))
	}
	if errText != "" { // a result recorded as used without it (too large, not JSON)
		upd = upd.Set(expression.Name(MarkAttr), expression.Value(errText))
	}
	x, err := expression.NewBuilder().WithUpdate(upd).WithCondition(expression.Name(TokenAttr).Equal(expression.Value(held.Token))).Build()
	if err != nil {
		return ledger.Call{}, fmt.Errorf("nexjob: powertools: build the record: %w", err)
	}
	_, err = b.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(b.o.Table), Key: b.key(held.KeyHash),
		UpdateExpression: x.Update(), ConditionExpression: x.Condition(), ExpressionAttributeNames: x.Names(), ExpressionAttributeValues: x.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return out, nil
	case errors.As(err, &ccf):
		if tok, _ := ccf.Item[TokenAttr].(*types.AttributeValueMemberS); tok != nil && tok.Value == out.Token {
			return out, nil // our own update, applied, its reply lost
		}
		return ledger.Call{}, ledger.ErrCallTakenOver
	case !ledger.OutcomeUnknown(err):
		return ledger.Call{}, fmt.Errorf("nexjob: powertools: record %s in %s: %w", held.KeyHash, b.o.Table, err)
	}
	if cur, ok, rerr := b.GetCall(ctx, held.KeyHash); rerr == nil {
		switch {
		case ok && cur.Token == out.Token:
			return out, nil
		case !ok || cur.Token != held.Token:
			return ledger.Call{}, ledger.ErrCallTakenOver
		}
	}
	return ledger.Call{}, &ledger.UnknownOutcomeError{ID: held.KeyHash, Err: fmt.Errorf("nexjob: powertools: record in %s: %w", b.o.Table, err), Nonce: out.Token}
}

// ReleaseCall is idempotency.Backend's: a DeleteItem conditional on the
// hold being the caller's (Powertools' own delete is not).
func (b *Backend) ReleaseCall(ctx context.Context, held ledger.Call) error {
	x, err := expression.NewBuilder().WithCondition(expression.Name(TokenAttr).Equal(expression.Value(held.Token))).Build()
	if err != nil {
		return fmt.Errorf("nexjob: powertools: build the release: %w", err)
	}
	_, err = b.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(b.o.Table), Key: b.key(held.KeyHash),
		ConditionExpression: x.Condition(), ExpressionAttributeNames: x.Names(), ExpressionAttributeValues: x.Values(),
	})
	var ccf *types.ConditionalCheckFailedException
	if err == nil || errors.As(err, &ccf) {
		return nil
	}
	if ledger.OutcomeUnknown(err) {
		if cur, ok, rerr := b.GetCall(ctx, held.KeyHash); rerr == nil && (!ok || cur.Token != held.Token) {
			return nil
		}
	}
	return fmt.Errorf("nexjob: powertools: release %s in %s: %w", held.KeyHash, b.o.Table, err)
}

// GetCall is idempotency.Backend's: one consistent GetItem.
func (b *Backend) GetCall(ctx context.Context, keyHash string) (ledger.Call, bool, error) {
	out, err := b.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(b.o.Table), Key: b.key(keyHash), ConsistentRead: aws.Bool(true)})
	if r := b.refused(err); r != nil {
		return ledger.Call{}, false, r
	}
	if err != nil {
		return ledger.Call{}, false, fmt.Errorf("nexjob: powertools: read %s in %s: %w", keyHash, b.o.Table, err)
	}
	if len(out.Item) == 0 {
		return ledger.Call{}, false, nil
	}
	c, err := b.decode(keyHash, out.Item)
	if err != nil {
		return ledger.Call{}, false, err
	}
	if !b.o.Now().Before(c.ExpiresAt) {
		return ledger.Call{}, false, nil
	}
	return c, true, nil
}

// decode reads a Powertools record, whoever wrote it.
func (b *Backend) decode(keyHash string, item map[string]types.AttributeValue) (ledger.Call, error) {
	c := ledger.Call{KeyHash: keyHash, Policy: ledger.RejectAlways}
	status, _ := item[b.o.StatusAttr].(*types.AttributeValueMemberS)
	switch {
	case status != nil && status.Value == statusInProgress:
		c.State = ledger.Processing
	case status != nil && status.Value == statusCompleted:
		c.State = ledger.Succeeded
	default:
		return ledger.Call{}, fmt.Errorf("nexjob: powertools: record %s has no status Powertools writes", keyHash)
	}
	if n, ok := item[b.o.ExpiryAttr].(*types.AttributeValueMemberN); ok {
		if f, err := strconv.ParseFloat(n.Value, 64); err == nil {
			c.ExpiresAt = time.Unix(int64(f), 0)
		}
	}
	c.Until = c.ExpiresAt                                             // no in-progress expiry (Python outside Lambda): held to the record's expiry
	for _, a := range []string{b.o.InProgressExpiryAttr, UntilAttr} { // a Go hold's own end last: it wins
		if n, ok := item[a].(*types.AttributeValueMemberN); ok {
			if f, err := strconv.ParseFloat(n.Value, 64); err == nil {
				c.Until = ledger.Millis(int64(f))
			}
		}
	}
	if v, ok := item[b.o.ValidationAttr].(*types.AttributeValueMemberS); ok {
		c.PayloadHash = v.Value
	}
	if t, ok := item[TokenAttr].(*types.AttributeValueMemberS); ok {
		c.Token = t.Value
	}
	if m, ok := item[MarkAttr].(*types.AttributeValueMemberS); ok {
		c.Error = m.Value
	}
	if d, ok := item[b.o.DataAttr]; ok && c.State == ledger.Succeeded {
		r, err := b.result(d)
		if err != nil {
			return ledger.Call{}, fmt.Errorf("nexjob: powertools: record %s's data: %w", keyHash, err)
		}
		c.Result = r
	}
	return c, nil
}

// data is a result's JSON as the dialect stores it: Python's a string of
// JSON, TypeScript's the value itself.
func (b *Backend) data(result []byte) (types.AttributeValue, error) {
	if b.o.Dialect == Python {
		return &types.AttributeValueMemberS{Value: string(result)}, nil
	}
	v, err := value(result)
	if err != nil {
		return nil, fmt.Errorf("nexjob: powertools: the result: %w", err)
	}
	return attributevalue.Marshal(avNumbers(v))
}

// result is a record's data as JSON.
func (b *Backend) result(d types.AttributeValue) ([]byte, error) {
	if s, ok := d.(*types.AttributeValueMemberS); ok && b.o.Dialect == Python {
		return []byte(s.Value), nil
	}
	var v any
	if err := attributevalue.UnmarshalWithOptions(d, &v, func(o *attributevalue.DecoderOptions) { o.UseNumber = true }); err != nil {
		return nil, err
	}
	return jsonOf(v)
}

// refused names the likely cause of DynamoDB's refusal of a record or a
// key (a ValidationException: the table's key is not KeyAttr, or a sort
// key it lacks), nil for any other error.
func (b *Backend) refused(err error) error {
	var api smithy.APIError
	if !errors.As(err, &api) || api.ErrorCode() != "ValidationException" {
		return nil
	}
	return fmt.Errorf("nexjob: powertools: table %s refused the item: is its partition key %q (Options.KeyAttr)? The nexjob table's is \"pk\" (KeyAttr \"pk\", ExpiryAttr \"expiresAt\"), Powertools' own \"id\": %w", b.o.Table, b.o.KeyAttr, err)
}

func number(n int64) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
