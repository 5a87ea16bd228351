"""The Python Powertools side of powertools_attack_test.go: real Powertools
for AWS Lambda (Python) against the emulator. One JSON command on stdin,
one JSON answer on stdout (big integers kept: the Go side decodes with
UseNumber).

  {"op": "call", "table", "prefix", "event", "key_path", "payload_path"?,
   "result", "key_attr"?, "expiry_attr"?, "now_ms"?}
      -> {"result": ..., "ran": bool} or {"error": "<class>"}
      now_ms fixes Powertools' clock (a host whose clock reads that).
  {"op": "inprogress", ... as call, "remaining_ms": int|null}
      -> {} once save_inprogress wrote the INPROGRESS record
"""
import datetime
import json
import sys
import types

import aws_lambda_powertools.utilities.idempotency.base as ibase
import aws_lambda_powertools.utilities.idempotency.persistence.base as pbase
import aws_lambda_powertools.utilities.idempotency.persistence.datarecord as pdr
import aws_lambda_powertools.utilities.idempotency.persistence.dynamodb as pddb
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)


def fix_clock(now_ms):
    class Fixed(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime.fromtimestamp(now_ms / 1000, tz)

    shim = types.SimpleNamespace(datetime=Fixed, timedelta=datetime.timedelta)
    for m in (ibase, pbase, pdr, pddb):
        m.dt = shim


def main():
    cmd = json.loads(sys.stdin.read())
    if cmd.get("now_ms") is not None:
        fix_clock(cmd["now_ms"])
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
    if cmd["op"] == "inprogress":
        store.configure(config, key_prefix=cmd["prefix"])
        store.save_inprogress(data=cmd["event"], remaining_time_in_millis=cmd.get("remaining_ms"))
        print(json.dumps({}))
        return
    ran = []

    @idempotent_function(data_keyword_argument="event", config=config, persistence_store=store, key_prefix=cmd["prefix"])
    def charge(event):
        ran.append(True)
        return cmd["result"]

    try:
        out = charge(event=cmd["event"])
    except Exception as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        return
    print(json.dumps({"result": out, "ran": bool(ran)}))


main()
