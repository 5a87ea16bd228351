package ledger

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// Large step values in S3 (Options.BlobBucket).
//
// A step's value over MaxStepValueBytes (DynamoDB's item is 400 KB; a
// step item's value is held to Lambda durable functions' 256 KB
// checkpoint) is written as an S3 object, and the step's item in the
// steps table names it (AttrBlob) instead of holding the value. The
// object's key is the job's id, the steps' generation, the step name's
// hash and the value's SHA-256: content-addressed, so two runs that race
// to record different values write two objects, and the item (written
// once, conditional on its absence, as every step's) names the one the
// ledger keeps; the other is left to the bucket's lifecycle. A run reads
// the object back when it loads the job's steps (one GetObject each).
//
// How it fails. The object is written before the item: a run that dies
// between them leaves an object no item names (the lifecycle removes
// it), never an item that names no object. An object that a named item's
// read does not find (deleted by hand, or its bucket's lifecycle shorter
// than StepLife) fails the load with ErrBlobMissing: the run fails and is
// retried, nothing is invented. The bucket's lifecycle must keep objects
// at least StepLife (the construct's does).

// Blobs is the part of the S3 API the ledger uses.
type Blobs interface {
	PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error)
	GetObject(ctx context.Context, in *s3.GetObjectInput, opts ...func(*s3.Options)) (*s3.GetObjectOutput, error)
}

// MaxBlobStepBytes is the largest step value kept in S3.
const MaxBlobStepBytes = 32 << 20

// AttrBlob is a step item's attribute naming the S3 object that holds
// its value (Options.BlobBucket).
const AttrBlob = "blob"

// ErrBlobMissing: a step's item names an S3 object that is not there.
var ErrBlobMissing = errors.New("nexjob: a step's value is missing from the blob bucket")

// blobKey is the object key of value as step name of rec's job.
func blobKey(rec Record, name, value string) string {
	n := sha256.Sum256([]byte(name))
	v := sha256.Sum256([]byte(value))
	return fmt.Sprintf("steps/%s/%d/%s/%s", rec.ID, rec.StepsGen, hex.EncodeToString(n[:12]), hex.EncodeToString(v[:]))
}

// putBlob writes value as an object and returns its key.
func (s *Store) putBlob(ctx context.Context, rec Record, name, value string) (string, error) {
	key := blobKey(rec, name, value)
	if err := s.putObject(ctx, key, value); err != nil {
		return "", fmt.Errorf("nexjob: write the value of step %q of job %s to the blob bucket: %w", truncate(name, MaxStepName), rec.ID, err)
	}
	return key, nil
}

// getBlob reads the object key.
func (s *Store) getBlob(ctx context.Context, key string) (string, error) {
	v, _, err := s.getObject(ctx, key)
	return v, err
}

// getObject reads object key whole (at most MaxBlobStepBytes) and when it
// was last written: ErrBlobMissing when it is not there, or this store
// has no blob bucket.
func (s *Store) getObject(ctx context.Context, key string) (string, time.Time, error) {
	if s.blobs == nil {
		return "", time.Time{}, fmt.Errorf("%w: %s (this process has no blob bucket: NEXJOB_BLOB_BUCKET)", ErrBlobMissing, key)
	}
	out, err := s.blobs.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	if err != nil {
		var nsk *s3types.NoSuchKey
		if errors.As(err, &nsk) {
			return "", time.Time{}, fmt.Errorf("%w: %s", ErrBlobMissing, key)
		}
		return "", time.Time{}, fmt.Errorf("nexjob: read %s from the blob bucket: %w", key, err)
	}
	defer func() { _ = out.Body.Close() }()
	var b bytes.Buffer
	if _, err := io.Copy(&b, io.LimitReader(out.Body, MaxBlobStepBytes+1)); err != nil {
		return "", time.Time{}, fmt.Errorf("nexjob: read %s from the blob bucket: %w", key, err)
	}
	return b.String(), aws.ToTime(out.LastModified), nil
}

// putObject writes value as object key (JSON).
func (s *Store) putObject(ctx context.Context, key, value string) error {
	_, err := s.blobs.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(s.bucket), Key: aws.String(key), Body: strings.NewReader(value),
		ContentLength: aws.Int64(int64(len(value))), ContentType: aws.String("application/json"),
	})
	return err
}

// putResultBlob writes a run's result over ResultRoom as an object
// (results/<job>/<its SHA-256>) and returns its key.
func (s *Store) putResultBlob(ctx context.Context, rec Record, result string) (string, error) {
	v := sha256.Sum256([]byte(result))
	key := fmt.Sprintf("results/%s/%s", rec.ID, hex.EncodeToString(v[:]))
	if err := s.putObject(ctx, key, result); err != nil {
		return "", fmt.Errorf("nexjob: write the result of job %s to the blob bucket: %w", rec.ID, err)
	}
	return key, nil
}

// ResultOf is a Succeeded job's result: the record's (SucceededResult),
// or the blob bucket's object it names (Record.ResultBlob: one GetObject;
// ErrBlobMissing when gone, or when this store has no blob bucket). ""
// when it kept none, or has not succeeded.
func (s *Store) ResultOf(ctx context.Context, rec Record) (string, error) {
	if rec.State != Succeeded || rec.ResultBlob == "" {
		return rec.SucceededResult(), nil
	}
	return s.getBlob(ctx, rec.ResultBlob)
}

// MaxInlineArgsBytes is the most args a record carries when its store has
// a blob bucket: larger ones (up to MaxBlobStepBytes) are an object the
// record names (Record.ArgsBlob), so no write of the job pays for them
// (a record's every write is billed by its size: 300 KB of args would be
// about 300 write units a write).
const MaxInlineArgsBytes = 16 << 10

// argsRenewAfter is how old an args object may grow before a run writes
// it again: the bucket's lifecycle (StepLife) removes objects by age, and
// a job may live longer (a year ahead, then sleeps).
const argsRenewAfter = 366 * 24 * time.Hour

// PutArgsBlob writes a job's args as an object (args/<SHA-256 of its kind
// and args>: jobs of the same args share it, each enqueue writing it again)
// and returns its key. Call it before the record that names it is written.
func (s *Store) PutArgsBlob(ctx context.Context, kind, args string) (string, error) {
	if s.bucket == "" {
		return "", errors.New("nexjob: args over a record's room need a blob bucket (NEXJOB_BLOB_BUCKET)")
	}
	v := sha256.Sum256([]byte(kind + "\x00" + args))
	key := "args/" + hex.EncodeToString(v[:])
	if err := s.putObject(ctx, key, args); err != nil {
		return "", fmt.Errorf("nexjob: write a %s job's args to the blob bucket: %w", kind, err)
	}
	return key, nil
}

// ArgsOf is the job's args: the record's, or the object it names
// (Record.ArgsBlob: one GetObject; ErrBlobMissing when gone). With renew,
// an object older than a year is written again (one PutObject), so the
// bucket's lifecycle never takes the args of a job still open.
func (s *Store) ArgsOf(ctx context.Context, rec Record, renew bool) (string, error) {
	if rec.ArgsBlob == "" {
		return rec.Args, nil
	}
	args, written, err := s.getObject(ctx, rec.ArgsBlob)
	if err != nil {
		return "", fmt.Errorf("nexjob: the args of job %s: %w", rec.ID, err)
	}
	if rec.ArgsHash != "" && ArgsHash(rec.Kind, args) != rec.ArgsHash {
		// Anyone who may enqueue may write args/ objects: the record's hash
		// of its args decides which are its.
		return "", fmt.Errorf("%w: %s does not hold job %s's args (their hash differs from the record's)", ErrBlobMissing, rec.ArgsBlob, rec.ID)
	}
	if renew && !written.IsZero() && s.now().Sub(written) > argsRenewAfter {
		if _, err := s.PutArgsBlob(ctx, rec.Kind, args); err != nil {
			return "", err
		}
	}
	return args, nil
}

// HasBlobs reports whether the store keeps values over a record's room
// in a blob bucket (Options.BlobBucket).
func (s *Store) HasBlobs() bool { return s.bucket != "" }

// valueOf is a step item's value: its own, or its blob's.
func (s *Store) valueOf(ctx context.Context, item map[string]types.AttributeValue) (string, bool, error) {
	if v, ok := item[AttrStepValue].(*types.AttributeValueMemberS); ok {
		return v.Value, true, nil
	}
	if k, ok := item[AttrBlob].(*types.AttributeValueMemberS); ok {
		v, err := s.getBlob(ctx, k.Value)
		return v, true, err
	}
	return "", false, nil
}
