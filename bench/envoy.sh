#!/bin/bash
# bench/envoy.sh: rld's Envoy rate limit service against envoyproxy/ratelimit,
# side by side on one Redis, through gRPC: a hot key and Zipf keys, 64 calls in
# flight, DUR each (default 10s). Prints decisions/s, p50, p99 and the server's
# CPU time per decision. The peer is built from its Go module (module proxy,
# module cache); nothing of it is kept in the repository. Run from the repo root:
#   bench/envoy.sh [DUR]
set -euo pipefail
DUR=${1:-10s}
PEER=${PEER:-github.com/envoyproxy/ratelimit@v1.4.1-0.20260122083618-3fb702589d36}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
freeport() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 500); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.02; done; echo "port $1 never opened" >&2; return 1; }

REDIS_PORT=$(freeport)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
PIDS+=($!)
waitport "$REDIS_PORT"

# The limit: large enough that every call is decided and allowed.
mkdir -p "$TMP/runtime/ratelimit/config"
cat >"$TMP/runtime/ratelimit/config/bench.yaml" <<YAML
domain: bench
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 100000000
YAML

echo "building rld and the load generator"
(cd "$ROOT" && CGO_ENABLED=0 go build -tags grpcnotrace -o "$TMP/rld" ./cmd/rld && go build -o "$TMP/envoyload" ./bench/envoyload)

PEER_PORT=$(freeport)
PEER_DIR=$(go mod download -json "$PEER" 2>/dev/null | python3 -c 'import json,sys;print(json.load(sys.stdin).get("Dir",""))' || true)
PEER_OK=0
if [ -n "$PEER_DIR" ]; then
  echo "building the peer from $PEER_DIR"
  if (cd "$PEER_DIR" && GOFLAGS=-mod=mod go build -o "$TMP/peer" ./src/service_cmd) >"$TMP/peer-build.log" 2>&1; then
    PEER_OK=1
  else
    echo "the peer does not build: $(tail -3 "$TMP/peer-build.log")"
  fi
else
  echo "the module proxy does not serve $PEER: measuring rld alone"
fi

RLD_PORT=$(freeport)
"$TMP/rld" config import-envoy "$TMP/runtime/ratelimit/config/bench.yaml" \
  | sed "s/127.0.0.1:8081/127.0.0.1:$RLD_PORT/" >"$TMP/rld.toml"
cat >>"$TMP/rld.toml" <<TOML

[server]
socket = "$TMP/rld.sock"
http = ""
log_level = "warn"

[store]
redis = ["127.0.0.1:$REDIS_PORT"]
TOML

load() { # label addr pid keys
  "$TMP/envoyload" -label "$1" -addr "$2" -pid "$3" -keys "$4" -c 64 -d "$DUR"
}

echo "--- $(nproc) cores, $DUR per run, 64 in flight, Redis $(redis-server --version | awk '{print $3}')"
"$TMP/rld" serve -config "$TMP/rld.toml" >"$TMP/rld.log" 2>&1 &
RLD_PID=$!
PIDS+=($RLD_PID)
waitport "$RLD_PORT"
load "rld hot key" "127.0.0.1:$RLD_PORT" $RLD_PID 0
load "rld zipf 100k keys" "127.0.0.1:$RLD_PORT" $RLD_PID 100000
kill $RLD_PID; wait $RLD_PID 2>/dev/null || true

if [ $PEER_OK = 1 ]; then
  DEBUG_PORT=$(freeport); HTTP_PORT=$(freeport)
  env USE_STATSD=false LOG_LEVEL=warn REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$REDIS_PORT" \
    RUNTIME_ROOT="$TMP/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_APPDIRECTORY=config RUNTIME_WATCH_ROOT=false \
    GRPC_HOST=127.0.0.1 GRPC_PORT=$PEER_PORT HOST=127.0.0.1 PORT=$HTTP_PORT DEBUG_HOST=127.0.0.1 DEBUG_PORT=$DEBUG_PORT \
    "$TMP/peer" >"$TMP/peer.log" 2>&1 &
  PEER_PID=$!
  PIDS+=($PEER_PID)
  waitport "$PEER_PORT"
  load "envoyproxy/ratelimit hot" "127.0.0.1:$PEER_PORT" $PEER_PID 0
  load "envoyproxy/ratelimit zipf" "127.0.0.1:$PEER_PORT" $PEER_PID 100000
fi
