#!/usr/bin/env bash
# Runs a command against the default emulator, started here and stopped
# after: installs moto (pinned) into .cache/venv when missing, starts
# nexjobtest/emulator.py on a free 127.0.0.1 port, exports the standard SDK
# settings, runs "$@" and stops the emulator whatever happens.
#
# When AWS_ENDPOINT_URL is already set (LocalStack, another emulator) or
# NEXJOB_REAL_AWS=1, nothing is started and "$@" runs as it is.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
MOTO_VERSION=5.2.5 # as nexjobtest.MotoVersion and nexjobtest/requirements.txt
AWSCLI_VERSION=${AWSCLI_VERSION:-1.46.2}
venv="$top/.cache/venv"
clivenv="$top/.cache/awscli"

if [[ -n "${AWS_ENDPOINT_URL:-}" || "${NEXJOB_REAL_AWS:-}" == 1 ]]; then
  exec "$@"
fi

if ! "$venv/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
  echo "emulator: installing moto[server]==$MOTO_VERSION (pinned and hashed: nexjobtest/requirements.txt) into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes -r "$top/nexjobtest/requirements.txt"
fi

# The AWS CLI (its own virtualenv: its botocore pin differs from moto's),
# for the test that runs LocalStack's init hook against the emulator.
# Only when asked (make test): make run does not need it.
if [[ "${NEXJOB_WITH_AWSCLI:-}" == 1 ]]; then
  if ! "$clivenv/bin/aws" --version 2>&1 | grep -q "aws-cli/$AWSCLI_VERSION "; then
    echo "emulator: installing awscli==$AWSCLI_VERSION into $clivenv" >&2
    python3 -m venv "$clivenv"
    "$clivenv/bin/pip" install -q --disable-pip-version-check "awscli==$AWSCLI_VERSION"
  fi
  export NEXJOB_AWS_CLI="$clivenv/bin/aws"
fi

port=$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log="$top/.cache/emulator-$port.log"
"$venv/bin/python" "$top/nexjobtest/emulator.py" --port "$port" >"$log" 2>&1 &
pid=$!
# Stopped whatever happens; its log kept only when it has something in it.
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true; [[ -s "$log" ]] || rm -f "$log"' EXIT INT TERM
for _ in $(seq 1 100); do
  if curl -fs "http://127.0.0.1:$port/moto-api/" >/dev/null 2>&1; then break; fi
  if ! kill -0 $pid 2>/dev/null; then echo "emulator: failed to start, see $log" >&2; cat "$log" >&2; exit 1; fi
  sleep 0.1
done
echo "emulator: moto $MOTO_VERSION on http://127.0.0.1:$port (DynamoDB serialised)" >&2

export AWS_ENDPOINT_URL="http://127.0.0.1:$port"
export AWS_REGION=${AWS_REGION:-us-east-1}
export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-$AWS_REGION} # boto3's (a Powertools peer in a test)
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test}
export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test}
export NEXJOB_EMULATOR=moto
"$@"
