package ledger

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Attribute names of a job item. They are the one schema that the ledger,
// local provisioning and the CDK construct in infra/ share.
const (
	AttrPK           = "pk"           // partition key: "k#<key hash>" or "j#<job id>"
	AttrID           = "id"           // job id
	AttrKind         = "kind"         // job kind, from the args type
	AttrArgs         = "args"         // JSON-encoded args
	AttrState        = "state"        // one of the seven States
	AttrAttempt      = "attempt"      // attempts started so far
	AttrMaxAttempts  = "maxAttempts"  // attempt budget
	AttrKeyHash      = "keyHash"      // hashed idempotency key; absent when unkeyed
	AttrPolicy       = "policy"       // DuplicatePolicy name, for the record
	AttrCreatedAt    = "createdAt"    // Unix milliseconds
	AttrUpdatedAt    = "updatedAt"    // Unix milliseconds
	AttrRunAt        = "runAt"        // Unix milliseconds; when a Scheduled job is due (an ended job: when its last run began, Finish.Began)
	AttrDeadline     = "deadline"     // Unix milliseconds; not started by then: Expired
	AttrLeaseUntil   = "leaseUntil"   // Unix milliseconds; a Processing run's lease
	AttrToken        = "token"        // fencing token, incremented by every claim
	AttrLastError    = "lastError"    // last failure, for people
	AttrResult       = "result"       // a Succeeded run's JSON result (Record.Result)
	AttrResultBlob   = "resultBlob"   // the blob bucket's object holding a result over ResultRoom (Record.ResultBlob)
	AttrArgsBlob     = "argsBlob"     // the blob bucket's object holding args over MaxInlineArgsBytes (Record.ArgsBlob)
	AttrExpiresAt    = "expiresAt"    // TTL attribute, Unix seconds; set on terminal writes
	AttrParentID     = "parentId"     // continuation parent
	AttrChildren     = "children"     // string set: continuations waiting on this job
	AttrListState    = "listState"    // byState index partition key; present only in indexed states
	AttrListAt       = "listAt"       // byState index sort key, Unix milliseconds
	AttrListErr      = "listErr"      // lastError cut to MaxListError, projected into the index
	AttrUndispatched = "undispatched" // true while a written job's SQS send is known to have failed
	AttrNonce        = "nonce"        // the last update's nonce: a resend that meets it knows its write was applied
	AttrNonce1       = "nonce1"       // the update's before it (shifted down by each update)
	AttrNonce2       = "nonce2"       // and the one before that
	AttrHist0        = "hist0"        // the last run's end (Attempt), shifted down by each Finish
	AttrHist1        = "hist1"
	AttrHist2        = "hist2"
	AttrCutOffs      = "cutOffs"     // runs of the current attempt cut off by the invocation deadline
	AttrReturns      = "dlqReturns"  // times the DLQ consumer sent back a job that never started
	AttrReturnOf     = "dlqMsg"      // the dead letter last counted in dlqReturns
	AttrReturnAt     = "dlqAt"       // when the job was last sent back from the DLQ, unix ms
	AttrArgsHash     = "argsHash"    // fingerprint of kind and args (ArgsHash)
	AttrCancelled    = "cancelled"   // true on a Failed job an operator withdrew before it started
	AttrRequest      = "request"     // hash of the enqueue request that made the job (Record.Request)
	AttrRequestAt    = "reqAt"       // the request's place in the key's order, unix ms (Record.RequestAt)
	AttrHookPending  = "hookPending" // true on a Failed job whose dead-letter hook is still due
	AttrHookUntil    = "hookUntil"   // unix ms: end of the lease on the due hook (Record.HookUntil)
	AttrDefers       = "defers"      // runs deferred in a row by flow control (Record.Defers)
	AttrSlot         = "slot"        // unix ms: the throttle slot a deferred run holds (Record.Slot)
	AttrCancelReq    = "cancelReq"   // an operator's reason, asking a running job to stop at its next step (Record.CancelReq)
	AttrReopenWaits  = "reopenWaits" // a requeue asks the next run to open its timed-out waits again (Record.ReopenWaits)
	AttrTicket       = "ticket"      // a deferred run's place in its concurrency key's queue (Record.Ticket)
	AttrParents      = "parents"     // string set: a fan-in continuation's parents (Record.Parents)
	AttrReleased     = "released"    // string set: the parents that released it (Record.Released)
	AttrByCheck      = "byCheck"     // true once the guard's check message claimed the job (Record.ByCheck)
	AttrNonJob       = "nonJob"      // true on a record that keeps a message that was not a job (Record.NonJob)
	AttrCaller       = "caller"      // the job that started this one as its child (Record.Caller)
	AttrChildEnds    = "childEnds"   // ends of the job's children recorded in its steps (Record.ChildEnds)
	AttrAwaitEnd     = "awaitEnd"    // unix ms: end of the wait for children the job sleeps in (Record.AwaitEnd)
	AttrCompensable  = "comp"        // true once a run declared a compensation (Record.Compensable)
	AttrQueue        = "queue"       // the job's named queue, absent for the default one (Record.Queue)
)

// DeadLetterKind is the kind of the records that keep messages that were
// not jobs (malformed bodies, unknown ids), kept by the DLQ consumer. They
// are Failed from the start and cannot be requeued.
const DeadLetterKind = "nexjob.dead-letter"

// IndexByState is the sparse global secondary index that lists jobs by
// state, newest first. Only records in indexed states carry its key (see
// Options.IndexAllStates), so the hot path (Enqueued → Processing →
// Succeeded) writes nothing to it by default.
const IndexByState = "byState"

// TTLAttribute is the attribute DynamoDB's time to live must be enabled on.
const TTLAttribute = AttrExpiresAt

// IndexProjection is what the byState index holds besides its keys and
// the table's: what a listing shows (id, kind, state, times, attempts, the
// cut last error) and what Find filters on (expiresAt). Not the args nor
// the full error, so an index write is one write unit whatever they
// weigh; a listed job's detail is a GetItem.
var IndexProjection = []string{AttrID, AttrKind, AttrState, AttrCreatedAt, AttrUpdatedAt, AttrRunAt, AttrAttempt, AttrMaxAttempts, AttrExpiresAt, AttrCancelled, AttrListErr, AttrParentID}

// CreateTableInput describes the ledger table: on-demand, one string
// partition key. infra/ builds the same table with CDK from these names;
// local provisioning creates it from this value.
func CreateTableInput(table string) *dynamodb.CreateTableInput {
	return &dynamodb.CreateTableInput{
		TableName:   aws.String(table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(AttrPK), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(AttrListState), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(AttrListAt), AttributeType: types.ScalarAttributeTypeN},
		},
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{{
			IndexName: aws.String(IndexByState),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(AttrListState), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(AttrListAt), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeInclude, NonKeyAttributes: IndexProjection},
		}},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(AttrPK), KeyType: types.KeyTypeHash},
		},
		SSESpecification: &types.SSESpecification{Enabled: aws.Bool(true)},
		// The dispatch guard reads the stream to catch jobs written but
		// never sent (a producer that died between the two calls).
		StreamSpecification: &types.StreamSpecification{StreamEnabled: aws.Bool(true), StreamViewType: types.StreamViewTypeNewAndOldImages},
	}
}

// UpdateTimeToLiveInput turns on DynamoDB's TTL on TTLAttribute.
func UpdateTimeToLiveInput(table string) *dynamodb.UpdateTimeToLiveInput {
	return &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(TTLAttribute),
			Enabled:       aws.Bool(true),
		},
	}
}
