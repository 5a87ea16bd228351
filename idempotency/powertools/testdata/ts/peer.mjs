// The TypeScript Powertools side of idempotency/powertools' tests: real
// Powertools for AWS Lambda (TypeScript) and its DynamoDB persistence
// layer, against the emulator the Go test gives (AWS_ENDPOINT_URL). Reads
// one JSON command on stdin, prints one JSON answer (as peer.py).
import { IdempotencyConfig, makeIdempotent } from '@aws-lambda-powertools/idempotency';
import { BasePersistenceLayer } from '@aws-lambda-powertools/idempotency/persistence';
import { DynamoDBPersistenceLayer } from '@aws-lambda-powertools/idempotency/dynamodb';

class Hasher extends BasePersistenceLayer {
  async _deleteRecord() {}
  async _getRecord() {}
  async _putRecord() {}
  async _updateRecord() {}
}

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const cmd = JSON.parse(Buffer.concat(chunks).toString('utf8'));
if (cmd.op === 'hash') {
  const h = new Hasher();
  h.configure({ config: new IdempotencyConfig({}), keyPrefix: cmd.prefix });
  process.stdout.write(JSON.stringify({ keys: cmd.docs.map((d) => h.getHashedIdempotencyKey(JSON.parse(d))) }));
} else {
  const store = new DynamoDBPersistenceLayer({ tableName: cmd.table, keyAttr: cmd.key_attr || undefined, expiryAttr: cmd.expiry_attr || undefined, clientConfig: { endpoint: process.env.AWS_ENDPOINT_URL } });
  const config = new IdempotencyConfig({ eventKeyJmesPath: cmd.key_path, payloadValidationJmesPath: cmd.payload_path || undefined, throwOnNoIdempotencyKey: true });
  let ran = false;
  const charge = makeIdempotent(async (event) => { ran = true; return cmd.result; }, { persistenceStore: store, config, keyPrefix: cmd.prefix });
  try {
    const out = await charge(cmd.event);
    process.stdout.write(JSON.stringify({ result: out, ran }));
  } catch (e) {
    process.stdout.write(JSON.stringify({ error: e.name, message: e.message }));
  }
}
