package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// DynamoDB is the part of *dynamodb.Client the ledger uses. Tests wrap a
// real client in it to inject faults.
type DynamoDB interface {
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(context.Context, *dynamodb.DeleteItemInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	Scan(context.Context, *dynamodb.ScanInput, ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
}

// Options tune a Store. The zero value is ready to use.
type Options struct {
	// Now is the clock. Defaults to time.Now; tests inject their own.
	Now func() time.Time
	// KeySecret, when set, makes key hashes HMAC-SHA-256 under this secret
	// instead of plain SHA-256. Set it when keys carry guessable personal
	// data. Changing it orphans every existing key. Defaults to none.
	KeySecret []byte
	// IndexAllStates puts every state in the byState index, so that
	// Enqueued, Processing and Succeeded jobs can be listed too. It costs
	// about five more write units per job (index writes on enqueue, claim
	// and completion). Defaults to false: only Scheduled,
	// AwaitingContinuation, Failed and Expired are listed.
	IndexAllStates bool
	// IndexShards spreads each state's index entries over this many
	// partition key values ("Failed#0" … "Failed#15"): one value of a GSI
	// takes at most 1,000 write units a second, and a GSI that falls
	// behind throttles the table's writes. A job keeps one shard, from
	// its id. Every process of a deployment must agree (settings'
	// NEXJOB_INDEX_SHARDS; the construct sets it). Defaults to
	// DefaultIndexShards; at most MaxIndexShards.
	IndexShards int
	// StepsTable, when set, keeps each of a job's own steps as an item of
	// this table (CreateStepsTableInput) instead of in the job's record:
	// see offsteps.go. Every process of a deployment must agree (settings'
	// NEXJOB_STEPS_TABLE; the construct sets it). Steps recorded on a
	// record before it was set are read as they were. Defaults to none:
	// steps on the record, at most MaxSteps and MaxStepsBytes.
	StepsTable string
	// BlobBucket, with StepsTable and Blobs, keeps a step's value over
	// MaxStepValueBytes (up to MaxBlobStepBytes) as an S3 object of this
	// bucket: see blobs.go. Every process of a deployment must agree
	// (settings' NEXJOB_BLOB_BUCKET; the construct sets it). Defaults to
	// none: such a value is a *StepError.
	BlobBucket string
	// Blobs is the S3 client for BlobBucket (s3.NewFromConfig; path-style
	// addressing against an emulator). enqueue.New makes one from its
	// aws.Config when BlobBucket is set and Blobs is not.
	Blobs Blobs
}

// DefaultIndexShards is the byState index's shards per state: 16 values
// take 16,000 index write units a second per state, about 8,000 retries
// a second during a downstream outage (two index writes each).
const DefaultIndexShards = 16

// MaxIndexShards bounds IndexShards: listing reads every shard.
const MaxIndexShards = 256

// Store reads and writes job records in one DynamoDB table.
type Store struct {
	db       DynamoDB
	table    string
	now      func() time.Time
	secret   []byte
	indexAll bool
	shards   int
	steps    string // the steps table (Options.StepsTable)
	bucket   string // the blob bucket (Options.BlobBucket)
	blobs    Blobs
	// The text of Claim's and Finish's writes, by shape (see writeExpr).
	claims   shapes[bool]
	finishes shapes[finishShape]
}

// New returns a Store over the named table. It does no I/O; a missing table
// shows as a *types.ResourceNotFoundException wrapped in the first call's
// error.
func New(db DynamoDB, table string, opts *Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("nexjob: ledger needs a DynamoDB client")
	}
	if table == "" {
		return nil, errors.New("nexjob: ledger needs a table name")
	}
	s := &Store{db: db, table: table, now: time.Now, shards: DefaultIndexShards}
	if opts != nil {
		if opts.Now != nil {
			s.now = opts.Now
		}
		s.secret = append([]byte(nil), opts.KeySecret...)
		s.indexAll = opts.IndexAllStates
		if opts.IndexShards < 0 || opts.IndexShards > MaxIndexShards {
			return nil, fmt.Errorf("nexjob: IndexShards %d: want 1 to %d (0 takes %d)", opts.IndexShards, MaxIndexShards, DefaultIndexShards)
		}
		if opts.IndexShards > 0 {
			s.shards = opts.IndexShards
		}
		s.steps = opts.StepsTable
		s.bucket, s.blobs = opts.BlobBucket, opts.Blobs
		if s.bucket != "" && (s.blobs == nil || s.steps == "") {
			return nil, errors.New("nexjob: ledger's BlobBucket needs Blobs (an S3 client) and StepsTable")
		}
	}
	return s, nil
}

// Table returns the table name.
func (s *Store) Table() string { return s.table }

// Now returns the store's clock reading.
func (s *Store) Now() time.Time { return s.now() }

// ExpiresAfter is the expiry of a record kept d from now on the store's
// clock: the zero time (kept for ever) for d ≤ 0.
func (s *Store) ExpiresAfter(d time.Duration) time.Time {
	if d <= 0 {
		return time.Time{}
	}
	return s.now().Add(d)
}

// HashKey returns the stored form of an idempotency key.
func (s *Store) HashKey(key string) string { return hashKey(s.secret, key) }

// Item size. DynamoDB's limit is 400 KB, counting attribute names and
// values (AWS enforces 409,600 bytes; moto 405,000). A record's args are
// written once, at insert; every later write adds to the same item: the
// last error (at most MaxLastError bytes), the continuations' ids (at most
// MaxChildren), a result (at most MaxResultBytes), and fixed fields of a
// few hundred bytes. MaxArgsBytes leaves room for all of them under the
// smallest of those limits, so no later write of a record can fail for
// its size.
const (
	maxItemBytes = 400_000
	// reserveBytes covers every attribute but args at their largest.
	reserveBytes = MaxLastError + 8 + MaxChildren*64 + 2048 + len(AttrResult) + MaxResultBytes
	// MaxArgsBytes is the largest encoded args a record accepts.
	MaxArgsBytes = maxItemBytes - reserveBytes
	// MaxChildren bounds the continuations of one job.
	MaxChildren = 100
	// MaxParents bounds the parents of one fan-in continuation; their
	// ids (twice: Parents and Released) come out of its args' room.
	MaxParents = 16
)

// Get returns the job with this id, read strongly consistent. A record
// past its retention is ErrNotFound. A keyed job costs one read, or two
// once its key was re-used.
func (s *Store) Get(ctx context.Context, id string) (Record, error) {
	return s.get(ctx, id, true)
}

// GetByKey returns the job that holds the idempotency key, read strongly
// consistent (one read): ErrNotFound when none does, or its record is
// past its retention. The key is hashed as Insert hashes it.
func (s *Store) GetByKey(ctx context.Context, key string) (Record, error) {
	rec, ok, err := s.getPK(ctx, keyPrefix+s.HashKey(key), true)
	if err != nil {
		return Record{}, err
	}
	if !ok || rec.ExpiredAt(s.now()) {
		return Record{}, ErrNotFound
	}
	return rec, nil
}

// Peek is Get with an eventually consistent read (half the price; may be
// a moment stale): for checks whose mistakes a conditional write catches.
func (s *Store) Peek(ctx context.Context, id string) (Record, error) {
	return s.get(ctx, id, false)
}

func (s *Store) get(ctx context.Context, id string, consistent bool) (Record, error) {
	pks, err := locate(id)
	if err != nil {
		return Record{}, err
	}
	for _, pk := range pks {
		rec, ok, err := s.getPK(ctx, pk, consistent)
		if err != nil {
			return Record{}, err
		}
		if ok && rec.ID == id {
			if rec.ExpiredAt(s.now()) {
				return Record{}, ErrNotFound
			}
			return rec, nil
		}
	}
	return Record{}, ErrNotFound
}

func (s *Store) getPK(ctx context.Context, pk string, consistent bool) (Record, bool, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: pk}},
		ConsistentRead: aws.Bool(consistent),
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("nexjob: get job from %s: %w", s.table, err)
	}
	if len(out.Item) == 0 {
		return Record{}, false, nil
	}
	rec, err := decodeRecord(out.Item)
	if err != nil {
		return Record{}, false, fmt.Errorf("nexjob: decode job record: %w", err)
	}
	return rec, true, nil
}

// Delete removes the job with this id; deleting a keyed job frees its key.
// Deleting a job that does not exist is not an error. It returns the
// record it removed (DeleteItem's ALL_OLD, free), or a zero Record when
// there was none (a resend of a delete whose reply was lost finds none):
// the caller removes what the record pointed at (a far run's schedule).
// Only an ended job is removed (Succeeded, Failed or Expired): one that
// is active (a requeue made it so after the caller ended it) is left,
// and the zero Record returned; the caller reads it and ends it again.
func (s *Store) Delete(ctx context.Context, id string) (Record, error) {
	pks, err := locate(id)
	if err != nil {
		return Record{}, err
	}
	var old Record
	for _, pk := range pks {
		st := expression.Name(AttrState)
		cond, err := expression.NewBuilder().
			WithCondition(expression.Name(AttrID).Equal(expression.Value(id)).
				And(st.In(expression.Value(Succeeded), expression.Value(Failed), expression.Value(Expired)))).Build()
		if err != nil {
			return Record{}, fmt.Errorf("nexjob: build condition: %w", err)
		}
		out, err := s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName:                 aws.String(s.table),
			Key:                       map[string]types.AttributeValue{AttrPK: &types.AttributeValueMemberS{Value: pk}},
			ConditionExpression:       cond.Condition(),
			ExpressionAttributeNames:  cond.Names(),
			ExpressionAttributeValues: cond.Values(),
			ReturnValues:              types.ReturnValueAllOld,
		})
		var ccf *types.ConditionalCheckFailedException
		if err != nil && !errors.As(err, &ccf) {
			return Record{}, fmt.Errorf("nexjob: delete job from %s: %w", s.table, err)
		}
		if err == nil && len(out.Attributes) > 0 {
			if rec, derr := decodeRecord(out.Attributes); derr == nil {
				old = rec
			}
		}
	}
	return old, nil
}
