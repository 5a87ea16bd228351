"""The Powertools side of the powertools package's tests: real Powertools
for AWS Lambda (Python), its DynamoDB persistence layer, against the
emulator the Go test gives (AWS_ENDPOINT_URL). Reads one JSON command on
stdin, prints one JSON answer on stdout.

  {"op": "hash", "prefix": P, "docs": [JSON text, ...]}  -> {"keys": [...]}
      (a payload's hash is a key's, after its prefix)
  {"op": "call", "table": T, "prefix": P, "event": {...}, "key_path": "id",
   "payload_path": "amount"|null, "result": R, "key_attr": A?, "expiry_attr": E?}
      -> {"result": ..., "ran": true|false} or {"error": "<exception class>"}
"""
import json
import sys

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.persistence.base import BasePersistenceLayer


class Hasher(BasePersistenceLayer):
    def _get_record(self, idempotency_key):
        raise NotImplementedError

    def _put_record(self, data_record):
        raise NotImplementedError

    def _update_record(self, data_record):
        raise NotImplementedError

    def _delete_record(self, data_record):
        raise NotImplementedError


def main():
    cmd = json.load(sys.stdin)
    if cmd["op"] == "hash":
        h = Hasher()
        h.configure(IdempotencyConfig(), key_prefix=cmd["prefix"])
        print(json.dumps({"keys": [h._get_hashed_idempotency_key(json.loads(d)) for d in cmd["docs"]]}))
        return
    store = DynamoDBPersistenceLayer(
        table_name=cmd["table"],
        key_attr=cmd.get("key_attr") or "id",
        expiry_attr=cmd.get("expiry_attr") or "expiration",
    )
    config = IdempotencyConfig(
        event_key_jmespath=cmd["key_path"],
        payload_validation_jmespath=cmd.get("payload_path") or "",
        raise_on_no_idempotency_key=True,
    )
    ran = []

    @idempotent_function(data_keyword_argument="event", config=config, persistence_store=store, key_prefix=cmd["prefix"])
    def charge(event):
        ran.append(True)
        return cmd["result"]

    try:
        out = charge(event=cmd["event"])
    except Exception as e:  # the Go test asserts on the class's name
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        return
    print(json.dumps({"result": out, "ran": bool(ran)}))


main()
