"""The docker-less default emulator: moto's server, with DynamoDB serialised.

moto serves requests on threads without per-request locking, so a DynamoDB
condition check and its write can interleave across concurrent requests and
an atomicity test would prove nothing. This launcher runs moto's own WSGI
app, threaded so that SQS long polls do not block anything, but holds one
lock around every DynamoDB request: DynamoDB is served one request at a time,
as a conditional write must appear to be.

It also replaces how moto backs up a TransactWriteItems call. moto 5.2.5
deep-copies every table a transaction names, stream records included,
before each transaction, and on a cancelled one swaps the copy in as the
table. That costs the whole table per transaction, and the swap leaves
every open stream shard iterator on the old table's stream: a reader (the
dispatch guard) never sees another write, and each cancel leaks a whole
copy (a soak of 2,000 jobs grew moto past 24 GB). Here a transaction backs
up only the items it names and the stream's length, and a cancelled one
puts those items back and drops the stream records it wrote, in place.

A Scan of a secondary index is paged by the size of the index's entries
(its projection), as DynamoDB pages it; moto 5.2.5 counted each whole
item, so a Scan of the byState index over jobs with large args took a
page per MB of the args the index does not hold.

A queue's message list is changed under the queue's lock and in place:
moto rebuilt it on each delete outside any lock, and a send beside two
deletes (or a message moved to the DLQ beside one) was lost after its
SendMessage answered OK.

Each request found its service by listing moto's package directory (a
stat per service, hundreds) and matching the host against every
service's URL patterns; here the answer is kept per host. Request lines
are not logged unless NEXJOB_EMULATOR_LOG=1: under the soak, the two
cost the emulator a fifth of its time (py-spy, seed 20261206).

Usage: python emulator.py --port PORT [--host 127.0.0.1]
Health: GET /moto-api/ ; reset: POST /moto-api/reset
"""

import argparse
import time
import logging
import os
import signal
import sys
import threading

from werkzeug.serving import run_simple

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)


class SerialDynamoDB:
    """WSGI middleware: one DynamoDB request at a time, others untouched."""

    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if not target.startswith("DynamoDB_"):
            return self.app(environ, start_response)
        with self.lock:
            # Materialise the body inside the lock: the work may be lazy.
            return list(self.app(environ, start_response))


def patch_transactions():
    """TransactWriteItems backs up the items it names, not the tables."""
    import copy

    from moto.dynamodb import models

    real = copy.deepcopy

    class NoTableCopy:
        # moto's own backup step calls copy.deepcopy(table): hand back the
        # table itself (its "rollback" then puts the same table back);
        # everything else (an item's old image) is copied as before.
        @staticmethod
        def deepcopy(x, memo=None):
            if isinstance(x, models.Table):
                return x
            return real(x, memo)

    models.copy = NoTableCopy
    original = models.DynamoDBBackend.transact_write_items

    def transact_write_items(self, transact_items):
        saved, streams = [], {}
        for entry in transact_items:
            try:
                kind, op = next(iter(entry.items()))
                table = self.tables[op["TableName"]]
                attrs = op["Item"] if kind == "Put" else op["Key"]
                hash_key, range_key = self.get_keys_value(table, attrs)
            except Exception:
                continue  # moto reports it as it would have
            saved.append((table, hash_key, range_key, real(table.get_item(hash_key, range_key))))
            if table.stream_shard is not None:
                streams.setdefault(id(table), (table.stream_shard, len(table.stream_shard.items)))
        try:
            return original(self, transact_items)
        except BaseException:
            # The first backup of an item is its state before the call.
            for table, hash_key, range_key, item in reversed(saved):
                rows = table.items[hash_key] if range_key is not None else table.items
                key = range_key if range_key is not None else hash_key
                if item is None:
                    rows.pop(key, None)
                else:
                    rows[key] = item
                if range_key is not None and not table.items[hash_key]:
                    del table.items[hash_key]
            for shard, length in streams.values():
                del shard.items[length:]
            raise

    models.DynamoDBBackend.transact_write_items = transact_write_items


def patch_index_pages():
    """A Scan of an index pages by its entries' size, not the items'."""
    from moto.dynamodb.models.table import Table

    original = Table.has_idx_items

    def has_idx_items(self, index_name):
        # The items the index holds, as their index entries: moto's scan
        # sizes its 1 MB pages by these, and projects them again after.
        index = self.get_index(index_name)
        return [index.project(item) for item in original(self, index_name)]

    Table.has_idx_items = has_idx_items


def patch_sqs_retention():
    """A receive and a send read what they need of a queue without walking it.

    moto checks each message it hands out against the queue's retention
    period, which it reads through get_queue_attributes: that builds every
    attribute of the queue, three of them counts over all its messages
    (visible, in flight, delayed), three times per message received. A
    receive of ten from a queue of n messages walked it about 90 times,
    under the interpreter's one lock: the soak (seed 20261206), its queue
    thousands deep after the outage, saw the emulator at 100 % of a core
    with 60 % of its time in this check, its requests down from about
    6,000 to 240-1,500 a minute, and every worker waiting on it. Reading
    the period off the queue is what the check needs.
    """
    from moto.sqs import models

    def is_message_valid_based_on_retention_period(self, queue_name, message):
        queue = self.get_queue(queue_name)
        retain_until = int(queue.message_retention_period) + message.sent_timestamp / 1000
        return retain_until > models.unix_time()

    models.SQSBackend.is_message_valid_based_on_retention_period = is_message_valid_based_on_retention_period

    # A send reads one attribute (ContentBasedDeduplication) through the
    # same Queue.attributes, and so walked the queue three times per
    # message sent: within a send, the three counts (which no send uses)
    # are not made.
    sending = threading.local()

    def counted(prop):
        return property(lambda self: 0 if getattr(sending, "depth", 0) else prop.fget(self))

    for name in ("approximate_number_of_messages", "approximate_number_of_messages_not_visible", "approximate_number_of_messages_delayed"):
        setattr(models.Queue, name, counted(getattr(models.Queue, name)))
    send = models.SQSBackend.send_message

    def send_message(self, *args, **kwargs):
        sending.depth = getattr(sending, "depth", 0) + 1
        try:
            return send(self, *args, **kwargs)
        finally:
            sending.depth -= 1

    models.SQSBackend.send_message = send_message


def patch_sqs_lists():
    """A queue's message list changes under the queue's lock, in place.

    moto 5.2.5 deletes a message by building a new list of the queue's
    other messages and assigning it, outside the lock its sends append
    under; and a receive moves a message bound for the DLQ out of the
    list, outside any lock. Two deletes at once each build from the old
    list, and a send that appends to the first one's new list is undone by
    the second's assignment; a removal while a delete walks the list makes
    the walk skip the next message, which the new list then lacks. Either
    way SendMessage answered OK and the message was never received again:
    the 10k soak (seed 1796611249630198530, queues thousands deep, each
    delete walking them for milliseconds) left ten retries Scheduled with
    no message, and a stress of two senders beside three deleters on plain
    moto lost 1 message of 2,000. Here a delete and a receive hold the
    queue's lock (the Condition a long poll waits on, which its wait
    releases) and a delete edits the list in place.
    """
    from moto.sqs import models

    def delete_message(self, receipt_handle):
        with self._messages_lock:
            if receipt_handle in self.deleted_messages:
                return  # already deleted: SQS accepts it again
            keep = [m for m in self._messages if not m.had_receipt_handle(receipt_handle)]
            if len(keep) == len(self._messages):
                raise models.ReceiptHandleIsInvalid()
            for m in self._messages:
                if m.had_receipt_handle(receipt_handle):
                    self.pending_messages.discard(m)
                    self.deleted_messages.update(m.all_receipt_handles)
            self._messages[:] = keep

    models.Queue.delete_message = delete_message
    receive = models.SQSBackend.receive_message

    def receive_message(self, queue_name, *args, **kwargs):
        queue = self.get_queue(queue_name)
        with queue._messages_lock:
            return receive(self, queue_name, *args, **kwargs)

    models.SQSBackend.receive_message = receive_message


def patch_dispatch():
    """The backend for a host is looked up once, not per request."""
    found = {}
    original = DomainDispatcherApplication.get_backend_for_host

    def get_backend_for_host(self, host):
        # Called under the dispatcher's own lock.
        if host not in found:
            found[host] = original(self, host)
        return found[host]

    DomainDispatcherApplication.get_backend_for_host = get_backend_for_host


class IdleExit:
    """WSGI middleware: the process exits once no request has been in
    flight or begun for idle seconds (a shared emulator nobody uses)."""

    def __init__(self, app, idle):
        self.app, self.idle = app, idle
        self.lock = threading.Lock()
        self.busy, self.last = 0, time.monotonic()
        threading.Thread(target=self.watch, daemon=True).start()

    def __call__(self, environ, start_response):
        with self.lock:
            self.busy += 1
            self.last = time.monotonic()
        try:
            return self.app(environ, start_response)
        finally:
            with self.lock:
                self.busy -= 1
                self.last = time.monotonic()

    def watch(self):
        while True:
            time.sleep(min(5, self.idle))
            with self.lock:
                if self.busy == 0 and time.monotonic() - self.last >= self.idle:
                    os._exit(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    # 127.0.0.1 unless told otherwise (the compose profile binds the
    # container's interface and publishes it on the host's 127.0.0.1).
    parser.add_argument("--host", default="127.0.0.1")
    # A shared emulator (nexjobtest's, one per machine and user) ends
    # itself once no request came for this many seconds (0: never).
    parser.add_argument("--idle-exit", type=float, default=0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if os.environ.get("NEXJOB_EMULATOR_TRACEMALLOC"):
        # Debugging the emulator's memory: SIGUSR1 prints where it grew.
        import tracemalloc

        tracemalloc.start(25)

        def dump(*_):
            snap = tracemalloc.take_snapshot()
            for stat in snap.statistics("traceback")[:6]:
                print(stat, file=sys.stderr)
                for line in [l for l in stat.traceback.format() if "moto" in l or "werkzeug" in l][-6:]:
                    print("   ", line, file=sys.stderr)
            sys.stderr.flush()

        signal.signal(signal.SIGUSR1, dump)
    patch_transactions()
    patch_index_pages()
    patch_sqs_retention()
    patch_sqs_lists()
    patch_dispatch()
    if os.environ.get("NEXJOB_EMULATOR_LOG") != "1":
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app = SerialDynamoDB(DomainDispatcherApplication(create_backend_app))
    if args.idle_exit > 0:
        app = IdleExit(app, args.idle_exit)
    run_simple(
        args.host,
        args.port,
        app,
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
