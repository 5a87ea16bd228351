"""The docker-less default emulator: moto's server, with DynamoDB serialised.

moto serves requests on threads without per-request locking, so a DynamoDB
condition check and its write can interleave across concurrent requests and
an atomicity test would prove nothing. This launcher runs moto's own WSGI
app, threaded so that SQS long polls do not block anything, but holds one
lock around every DynamoDB request: DynamoDB is served one request at a time,
as a conditional write must appear to be.

Usage: python emulator.py --port PORT [--host 127.0.0.1]
Health: GET /moto-api/ ; reset: POST /moto-api/reset
"""

import argparse
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    # 127.0.0.1 unless told otherwise (the compose profile binds the
    # container's interface and publishes it on the host's 127.0.0.1).
    parser.add_argument("--host", default="127.0.0.1")
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
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        args.host,
        args.port,
        SerialDynamoDB(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
