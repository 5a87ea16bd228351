// The TypeScript Powertools side of powertools_attack_test.go (as
// attack_peer.py): ops "call" (now_ms fixes Date.now) and "inprogress"
// (saveInProgress with remaining_ms, or none).
import { IdempotencyConfig, makeIdempotent } from '@aws-lambda-powertools/idempotency';
import { DynamoDBPersistenceLayer } from '@aws-lambda-powertools/idempotency/dynamodb';

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const cmd = JSON.parse(Buffer.concat(chunks).toString('utf8'));
if (cmd.now_ms != null) Date.now = () => cmd.now_ms;
const store = new DynamoDBPersistenceLayer({ tableName: cmd.table, keyAttr: cmd.key_attr || undefined, expiryAttr: cmd.expiry_attr || undefined, clientConfig: { endpoint: process.env.AWS_ENDPOINT_URL } });
const config = new IdempotencyConfig({ eventKeyJmesPath: cmd.key_path, payloadValidationJmesPath: cmd.payload_path || undefined, throwOnNoIdempotencyKey: true });
if (cmd.op === 'inprogress') {
  store.configure({ config, keyPrefix: cmd.prefix });
  await store.saveInProgress(cmd.event, cmd.remaining_ms == null ? undefined : cmd.remaining_ms);
  process.stdout.write('{}');
} else {
  let ran = false;
  const charge = makeIdempotent(async (event) => { ran = true; return cmd.result; }, { persistenceStore: store, config, keyPrefix: cmd.prefix });
  try {
    const out = await charge(cmd.event);
    process.stdout.write(JSON.stringify({ result: out === undefined ? null : out, ran }));
  } catch (e) {
    process.stdout.write(JSON.stringify({ error: e.name, message: e.message }));
  }
}
