package provision

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/nexjob/nexjob-aws/ledger"
)

// BlobBucket creates the blob bucket (ledger.Options.BlobBucket) if it is
// missing: encrypted (SSE-S3), public access blocked, and a lifecycle
// that expires objects ledger.StepLife after they were written, as the
// construct's. A bucket that exists and is ours is no error.
func BlobBucket(ctx context.Context, c *s3.Client, name string) error {
	_, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)})
	var owned *s3types.BucketAlreadyOwnedByYou
	if err != nil && !errors.As(err, &owned) {
		return fmt.Errorf("provision: create bucket %s: %w", name, err)
	}
	if _, err := c.PutBucketEncryption(ctx, &s3.PutBucketEncryptionInput{Bucket: aws.String(name), ServerSideEncryptionConfiguration: &s3types.ServerSideEncryptionConfiguration{
		Rules: []s3types.ServerSideEncryptionRule{{ApplyServerSideEncryptionByDefault: &s3types.ServerSideEncryptionByDefault{SSEAlgorithm: s3types.ServerSideEncryptionAes256}}},
	}}); err != nil {
		return fmt.Errorf("provision: encrypt bucket %s: %w", name, err)
	}
	if _, err := c.PutPublicAccessBlock(ctx, &s3.PutPublicAccessBlockInput{Bucket: aws.String(name), PublicAccessBlockConfiguration: &s3types.PublicAccessBlockConfiguration{
		BlockPublicAcls: aws.Bool(true), BlockPublicPolicy: aws.Bool(true), IgnorePublicAcls: aws.Bool(true), RestrictPublicBuckets: aws.Bool(true),
	}}); err != nil {
		return fmt.Errorf("provision: block public access to bucket %s: %w", name, err)
	}
	days := int32(ledger.StepLife.Hours()/24) + 1
	if _, err := c.PutBucketLifecycleConfiguration(ctx, &s3.PutBucketLifecycleConfigurationInput{Bucket: aws.String(name), LifecycleConfiguration: &s3types.BucketLifecycleConfiguration{
		Rules: []s3types.LifecycleRule{{ID: aws.String("steps-expire"), Status: s3types.ExpirationStatusEnabled, Filter: &s3types.LifecycleRuleFilter{Prefix: aws.String("steps/")},
			Expiration: &s3types.LifecycleExpiration{Days: aws.Int32(days)}}},
	}}); err != nil {
		return fmt.Errorf("provision: set the lifecycle of bucket %s: %w", name, err)
	}
	return nil
}

// S3 is an S3 client for cfg: path-style addressing when cfg names an
// endpoint of its own (an emulator, LocalStack), as ledger's blobs need.
func S3(cfg aws.Config) *s3.Client {
	return s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.UsePathStyle = cfg.BaseEndpoint != nil
		o.DisableLogOutputChecksumValidationSkipped = true
	})
}
