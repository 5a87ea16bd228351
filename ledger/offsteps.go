package ledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Steps off the record (Options.StepsTable).
//
// A job's record held its steps in one map: every later write of the
// record (a step, a claim, a finish) paid for every recorded byte, so 100
// steps of 600 bytes cost 3,134 write units in all, the square of the
// step count, and the 400 KB item capped a job at 100 steps and 64 KB.
// With a steps table, each step of the job's own (Step, StepWith and its
// retries' records) is an item of its own in the job's partition of that
// table: key (pk the job's id, sk the generation and the step's name),
// written once by PutItem conditional on its absence, and a job's run
// reads them all back with one strongly consistent Query per MB, the
// first time it looks a step up (a run of a job with no step reads
// nothing). A step then costs one request and its own size in write
// units (one for a value under about 900 bytes) whatever the job's step
// count, and a claim or a finish costs the same at step 1 and at step
// 10,000: the record carries none of them.
//
// The waits, signals, callback tokens and a wait-for-any's choice stay on
// the record (their writes are conditional on the job's state, which
// only the record's own write can check), under the limits of steps.go.
//
// How it fails. The first write of a step's name wins: a write that meets
// the item (its own applied before, its reply lost; or another run's, a
// run whose lease this one took over) reads the recorded value back from
// the failed condition and returns it, so every run goes on with the
// value the ledger holds. A write is not fenced by the record's token:
// the run's next write of the record is (its sleep, its end), and the run
// looks at its record for a cancel or a newer claim at a step when it has
// not for CancelLook (Look). A step item outlives its job: it expires
// StepLife after it was written, and a run that loads items with less
// than a year of that left writes their expiry again (a job that sleeps
// on for years).

// Limits of steps off the record.
const (
	MaxJobSteps       = 10_000    // steps of a job in the steps table
	MaxStepValueBytes = 256 << 10 // one step's value there (Lambda durable functions' checkpoint)
	MaxJobStepsBytes  = 64 << 20  // all of a job's step values there: a run holds them in memory
)

// StepLife is how long a step's item is kept after it was written (its
// TTL): two of the longest waits, so a job's retention after its end
// (days) finds its steps still there.
const StepLife = 2 * 366 * 24 * time.Hour

// CancelLook is how long a run with steps off the record goes without
// looking at its record (Look) before its next step's write.
const CancelLook = 2 * time.Second

// Attributes of a step's item, and the record's generation of its steps.
const (
	AttrStepKey   = "sk"       // sort key: "<generation>/<step's name>"
	AttrStepValue = "v"        // the step's result (JSON)
	AttrStepAt    = "at"       // when it was written, unix ms
	AttrStepIn    = "in"       // the step whose function wrote it, if nested (PutStepIn)
	AttrStepsGen  = "stepsGen" // on the record: ForgetSteps moves it on, and earlier items are left to expire
	AttrRan       = "ran"      // on the record: a run recorded a step in the steps table (Finish.Ran)
)

// OffRecord reports whether step name of a job goes to the steps table:
// with one configured, the job's own steps and its step retries' records;
// never a wait, a signal, a token or a choice.
func (s *Store) OffRecord(name string) bool {
	if s.steps == "" {
		return false
	}
	for _, p := range []string{signalStep, waitStep, tokenStep, "nexjob:any:"} {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	return true
}

// StepsTable is the steps table's name ("" when steps stay on the record).
func (s *Store) StepsTable() string { return s.steps }

// OffSteps is what a run knows of its job's steps in the steps table:
// their values by name, and their count and bytes (Count may be more than
// len(Values): steps being written by the run's other goroutines).
type OffSteps struct {
	Values       map[string]string
	Count, Bytes int
}

// CheckOffStep says whether step name with result may be added to a job
// that holds have in the steps table (nil: it may), without a blob bucket.
func CheckOffStep(have OffSteps, name, result string) error {
	return checkOffStep(have, name, result, MaxStepValueBytes)
}

// CheckOffStep is the package's CheckOffStep for this store: a value up
// to MaxBlobStepBytes with a blob bucket (Options.BlobBucket).
func (s *Store) CheckOffStep(have OffSteps, name, result string) error {
	most := MaxStepValueBytes
	if s.bucket != "" {
		most = MaxBlobStepBytes
	}
	return checkOffStep(have, name, result, most)
}

func checkOffStep(have OffSteps, name, result string, most int) error {
	switch {
	case usersName(name) == "" || len(usersName(name)) > MaxStepName || !utf8.ValidString(name):
		return &StepError{Name: truncate(name, MaxStepName), Reason: fmt.Sprintf("a step's name is 1 to %d bytes of UTF-8", MaxStepName)}
	case len(result) > most && most == MaxStepValueBytes:
		return &StepError{Name: name, Reason: fmt.Sprintf("its result is %d bytes, the limit is %d (ledger.MaxStepValueBytes; a blob bucket takes up to ledger.MaxBlobStepBytes)", len(result), most)}
	case len(result) > most:
		return &StepError{Name: name, Reason: fmt.Sprintf("its result is %d bytes, the limit is %d (ledger.MaxBlobStepBytes)", len(result), most)}
	case have.Count+1 > MaxJobSteps:
		return &StepError{Name: name, Reason: fmt.Sprintf("the job would have %d steps, the limit is %d (ledger.MaxJobSteps)", have.Count+1, MaxJobSteps)}
	case have.Bytes+len(result) > MaxJobStepsBytes:
		return &StepError{Name: name, Reason: fmt.Sprintf("the job's steps would be %d bytes, the limit is %d (ledger.MaxJobStepsBytes)", have.Bytes+len(result), MaxJobStepsBytes)}
	}
	return nil
}

// offKey is a step's item key.
func offKey(id string, gen int, name string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		AttrPK:      &types.AttributeValueMemberS{Value: id},
		AttrStepKey: &types.AttributeValueMemberS{Value: strconv.Itoa(gen) + "/" + name},
	}
}

// PutStep records step name's result for rec's job in the steps table:
// one PutItem conditional on the item's absence. It returns the value the
// ledger holds: result, or the value a write before it recorded (its own
// resend after a lost reply, or another run's). have is what the run
// holds (LoadSteps), for the limits: a step outside them is a *StepError,
// nothing written.
func (s *Store) PutStep(ctx context.Context, rec Record, have OffSteps, name, result string) (string, error) {
	return s.PutStepIn(ctx, rec, have, name, "", result)
}

// PutStepIn is PutStep of a step recorded inside step in's function (a
// Map item's, a step's own nested steps), kept with it (StepItem.In): a
// replay that replays in without calling its function does not reach it.
func (s *Store) PutStepIn(ctx context.Context, rec Record, have OffSteps, name, in, result string) (string, error) {
	if err := s.CheckOffStep(have, name, result); err != nil {
		return "", err
	}
	now := s.now()
	item := offKey(rec.ID, rec.StepsGen, name)
	if len(result) > MaxStepValueBytes {
		key, err := s.putBlob(ctx, rec, name, result) // before the item: no item names a missing object
		if err != nil {
			return "", err
		}
		item[AttrBlob] = &types.AttributeValueMemberS{Value: key}
	} else {
		item[AttrStepValue] = &types.AttributeValueMemberS{Value: result}
	}
	item[AttrStepAt] = &types.AttributeValueMemberN{Value: strconv.FormatInt(now.UnixMilli(), 10)}
	if in != "" {
		item[AttrStepIn] = &types.AttributeValueMemberS{Value: in}
	}
	item[AttrExpiresAt] = &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Add(StepLife).Unix(), 10)}
	_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.steps),
		Item:                                item,
		ConditionExpression:                 aws.String("attribute_not_exists(#pk)"),
		ExpressionAttributeNames:            map[string]string{"#pk": AttrPK},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		v, ok, verr := s.valueOf(ctx, ccf.Item)
		switch {
		case verr != nil:
			return "", verr
		case ok:
			return v, nil // the first write of the name wins
		}
		return "", fmt.Errorf("nexjob: record step %q of job %s: its item holds no value", truncate(name, MaxStepName), rec.ID)
	}
	if err != nil {
		return "", fmt.Errorf("nexjob: record step %q of job %s: %w", truncate(name, MaxStepName), rec.ID, err)
	}
	return result, nil
}

// LoadSteps reads rec's job's steps from the steps table: one strongly
// consistent Query per MB of them. Items with less than a year of their
// life left are written again with a new expiry (one UpdateItem each).
func (s *Store) LoadSteps(ctx context.Context, rec Record) (OffSteps, error) {
	out := OffSteps{Values: map[string]string{}}
	if s.steps == "" {
		return out, nil
	}
	renewBefore := s.now().Add(StepLife - 366*24*time.Hour).Unix()
	var renew []string
	err := s.querySteps(ctx, rec, true, func(name, v string, it map[string]types.AttributeValue) {
		out.Values[name] = v
		out.Count++
		out.Bytes += len(v)
		if exp, err := num(it[AttrExpiresAt]); err == nil && exp < renewBefore {
			renew = append(renew, name)
		}
	})
	if err != nil {
		return OffSteps{}, err
	}
	for _, name := range renew {
		exp := strconv.FormatInt(s.now().Add(StepLife).Unix(), 10)
		if _, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(s.steps), Key: offKey(rec.ID, rec.StepsGen, name),
			UpdateExpression:          aws.String("SET #e = :e"),
			ConditionExpression:       aws.String("attribute_exists(#pk)"),
			ExpressionAttributeNames:  map[string]string{"#e": AttrExpiresAt, "#pk": AttrPK},
			ExpressionAttributeValues: map[string]types.AttributeValue{":e": &types.AttributeValueMemberN{Value: exp}},
		}); err != nil && !isConditionFailed(err) {
			return OffSteps{}, fmt.Errorf("nexjob: keep the steps of job %s: %w", rec.ID, err)
		}
	}
	return out, nil
}

// querySteps reads rec's job's step items of its generation (one strongly
// consistent Query per MB) and calls fn with each one's name and value
// (with blobs, a value kept in the blob bucket read from it; without,
// "" for one).
func (s *Store) querySteps(ctx context.Context, rec Record, blobs bool, fn func(name, value string, item map[string]types.AttributeValue)) error {
	prefix := strconv.Itoa(rec.StepsGen) + "/"
	key := expression.Key(AttrPK).Equal(expression.Value(rec.ID)).And(expression.Key(AttrStepKey).BeginsWith(prefix))
	x, err := expression.NewBuilder().WithKeyCondition(key).Build()
	if err != nil {
		return err
	}
	p := dynamodb.NewQueryPaginator(s.db, &dynamodb.QueryInput{
		TableName: aws.String(s.steps), ConsistentRead: aws.Bool(true),
		KeyConditionExpression: x.KeyCondition(), ExpressionAttributeNames: x.Names(), ExpressionAttributeValues: x.Values(),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("nexjob: read the steps of job %s: %w", rec.ID, err)
		}
		for _, it := range page.Items {
			sk, err := str(it[AttrStepKey])
			if err != nil {
				return fmt.Errorf("nexjob: read the steps of job %s: %w", rec.ID, err)
			}
			v, ok, err := "", true, error(nil)
			if _, blob := it[AttrBlob]; !blob || blobs {
				v, ok, err = s.valueOf(ctx, it) // a blob's read from S3
			}
			switch {
			case err != nil:
				return err
			case !ok:
				return fmt.Errorf("nexjob: read the steps of job %s: step %q holds no value", rec.ID, sk)
			}
			fn(strings.TrimPrefix(sk, prefix), v, it)
		}
	}
	return nil
}

// isConditionFailed reports whether err is a failed condition.
func isConditionFailed(err error) bool {
	var ccf *types.ConditionalCheckFailedException
	return errors.As(err, &ccf)
}

// Look reads what a run with steps off the record must know before its
// next step: whether an operator asked it to stop (ErrCancelRequested)
// or a newer claim took the job (ErrFenced). One strongly consistent
// GetItem of three attributes.
func (s *Store) Look(ctx context.Context, rec Record) error {
	proj := expression.NamesList(expression.Name(AttrToken), expression.Name(AttrState), expression.Name(AttrCancelReq))
	x, err := expression.NewBuilder().WithProjection(proj).Build()
	if err != nil {
		return err
	}
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.table), Key: map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: rec.PK}}, ConsistentRead: aws.Bool(true),
		ProjectionExpression: x.Projection(), ExpressionAttributeNames: x.Names(),
	})
	if err != nil {
		return fmt.Errorf("nexjob: look at job %s: %w", rec.ID, err)
	}
	cur, err := decodeRecord(out.Item)
	switch {
	case err != nil:
		return fmt.Errorf("nexjob: look at job %s: %w", rec.ID, err)
	case cur.Token == rec.Token && cur.CancelReq != "":
		return fmt.Errorf("%w: %s", ErrCancelRequested, truncate(cur.CancelReq, MaxLastError))
	case cur.Token != rec.Token || cur.State != Processing:
		return fmt.Errorf("%w (job %s, token %d)", ErrFenced, rec.ID, rec.Token)
	}
	return nil
}

// CreateStepsTableInput describes the steps table: on-demand, the job's
// id as partition key and the step's generation and name as sort key,
// encrypted, TTL on AttrExpiresAt (UpdateTimeToLiveInput).
func CreateStepsTableInput(table string) *dynamodb.CreateTableInput {
	return &dynamodb.CreateTableInput{
		TableName:   aws.String(table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(AttrPK), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(AttrStepKey), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(AttrPK), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(AttrStepKey), KeyType: types.KeyTypeRange},
		},
		SSESpecification: &types.SSESpecification{Enabled: aws.Bool(true)},
	}
}

// WithSteps is rec with its Steps whole: those on the record and those in
// the steps table (its generation's), in one map, as a run sees them. A
// reader's view (the test kit, the CLI, the dashboard); a job with no
// steps table costs no request. It writes nothing: one strongly
// consistent Query per MB of steps (and a GetObject per value kept in the
// blob bucket).
func (s *Store) WithSteps(ctx context.Context, rec Record) (Record, error) {
	if s.steps == "" {
		return rec, nil
	}
	// Read only (a run's LoadSteps renews old steps' expiry; a reader
	// writes nothing).
	all := StepMap{}
	err := s.querySteps(ctx, rec, true, func(name, v string, _ map[string]types.AttributeValue) { all[name] = v })
	if err != nil || len(all) == 0 {
		return rec, err
	}
	maps.Copy(all, rec.Steps)
	rec.Steps = all
	return rec, nil
}

// StepItem is one of a job's steps as an operator sees it (StepItems).
type StepItem struct {
	Name  string
	Value string
	At    int64  // unix ms it was written (0 for a step kept on the record: not kept)
	Where string // "record" or "steps table"
	In    string // the step whose function recorded it ("" none; kept for steps table items)
}

// StepItems lists rec's job's steps (a value kept in the blob bucket by
// its object's key, Where "blob bucket": not read), those on its record and those in the
// steps table (its generation's, with when each was written), in the
// order they were written as far as known (the record's, whose times are
// not kept, last by name). A reader's view (the CLI's get, the
// dashboard's job page): one Query per MB of the job's steps.
func (s *Store) StepItems(ctx context.Context, rec Record) ([]StepItem, error) {
	return s.stepItems(ctx, rec, false)
}

// stepItems is StepItems; with blobs, a value kept in the blob bucket is
// read from it (its Where still "blob bucket").
func (s *Store) stepItems(ctx context.Context, rec Record, blobs bool) ([]StepItem, error) {
	var out []StepItem
	if s.steps != "" {
		err := s.querySteps(ctx, rec, blobs, func(name, v string, it map[string]types.AttributeValue) {
			at, _ := num(it[AttrStepAt])
			item := StepItem{Name: name, Value: v, At: at, Where: "steps table"}
			if in, ok := it[AttrStepIn].(*types.AttributeValueMemberS); ok {
				item.In = in.Value
			}
			if k, ok := it[AttrBlob].(*types.AttributeValueMemberS); ok {
				item.Where = "blob bucket"
				if !blobs {
					item.Value = k.Value // not read: a reader sees where, not megabytes
				}
			}
			out = append(out, item)
		})
		if err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(out, func(a, b StepItem) int { return cmp.Compare(a.At, b.At) })
	for _, name := range slices.Sorted(maps.Keys(rec.Steps)) {
		out = append(out, StepItem{Name: name, Value: rec.Steps[name], Where: "record"})
	}
	return out, nil
}
