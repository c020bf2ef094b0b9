#!/usr/bin/env bash
# `make run`: a one-machine Nstance shard from examples/local/ on file:// storage.
#
# Sets up the cluster (CA, nonce key, shard config, an operator identity), starts nstance-server with
# the local provider (each instance is an nstance-agent process), scales the example group to 3 and
# shows the instances live. Ctrl-C stops the server, which stops every instance it started.
#
# State lives in .local/ (object storage in .local/storage, a development encryption key in
# .local/encryption.key, the server's cache in .local/cache). Re-running keeps the cluster: the CA is
# never overwritten. Expects the project's .venv/bin on PATH (the Makefile arranges that).
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=.local
STORAGE="$STATE/storage"
CONFIG=examples/local/config.jsonc
SHARD=local-a
CLUSTER=local

mkdir -p "$STATE"
if [ ! -s "$STATE/encryption.key" ]; then
    (umask 077 && nstance-admin secrets generate-key > "$STATE/encryption.key.tmp")
    mv "$STATE/encryption.key.tmp" "$STATE/encryption.key"
    echo "generated a development encryption key in $STATE/encryption.key"
fi
NSTANCE_ENCRYPTION_KEY="$(cat "$STATE/encryption.key")"
export NSTANCE_ENCRYPTION_KEY

echo "== validating $CONFIG"
nstance-admin config validate "$CONFIG"

echo "== initialising cluster '$CLUSTER' in $STORAGE"
nstance-admin cluster init --cluster-id "$CLUSTER" \
    --storage-provider file --storage-bucket "$STORAGE" --exist-ok

echo "== uploading the shard config"
nstance-admin config upload "$CONFIG" --shard "$SHARD" \
    --storage-provider file --storage-bucket "$STORAGE"

IDENTITY="$STATE/operator-identity"
if [ ! -s "$IDENTITY/identity.crt" ]; then
    echo "== registering an operator identity in $IDENTITY"
    nstance-admin cluster register-operator --cluster-id "$CLUSTER" --output-dir "$IDENTITY" \
        --storage-provider file --storage-bucket "$STORAGE"
fi

export NSTANCE_ADMIN_SERVERS="$SHARD=127.0.0.1:8993"
export NSTANCE_ADMIN_IDENTITY_DIR="$IDENTITY"
INSTANCES="$PWD/$STATE/cache/local-instances"
SERVER_PID=""

cleanup() {
    trap - INT TERM EXIT
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        echo
        echo "== stopping nstance-server (it stops the instances it started)"
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    # Safety net: no agent process of this demo may outlive it.
    pkill -TERM -f -- "--instance-dir $INSTANCES/" 2>/dev/null || true
    echo "stopped; the server log is $STATE/server.log"
}
trap cleanup INT TERM EXIT

# The local provider's agents inherit the server's environment: report as often as the example's
# shard.health_check_interval (10s) expects, or they would count as silent after three intervals.
export NSTANCE_REPORT_INTERVAL=10s

echo "== starting nstance-server (log: $STATE/server.log)"
nstance-server --id local-1 --shard "$SHARD" --storage file --bucket "$STORAGE" \
    --cachedir "$STATE/cache" --health-addr 127.0.0.1:8990 >>"$STATE/server.log" 2>&1 &
SERVER_PID=$!

for _ in $(seq 1 100); do
    if curl -fsS http://127.0.0.1:8990/leader/health >/dev/null 2>&1; then break; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "nstance-server exited; last log lines:"; tail -n 20 "$STATE/server.log"; exit 1
    fi
    sleep 0.2
done
echo "== $(curl -sS http://127.0.0.1:8990/health)"

echo "== scaling group 'app' to 3"
nstance-admin group scale app 3

echo
echo "From a second terminal, with the same environment:"
echo "  export NSTANCE_ADMIN_SERVERS=$NSTANCE_ADMIN_SERVERS NSTANCE_ADMIN_IDENTITY_DIR=$PWD/$IDENTITY"
echo "  .venv/bin/nstance-admin group scale app 5"
echo "Press Ctrl-C to stop everything."
sleep 2
while kill -0 "$SERVER_PID" 2>/dev/null; do
    printf '\033[2J\033[H'
    echo "Nstance local shard $SHARD  (Ctrl-C stops the server and every instance)   $(date +%T)"
    echo
    nstance-admin group list 2>&1 || true
    echo
    # Each live local instance with the state the server reports: pending -> registered -> healthy.
    printf '%-32s %-12s %s\n' INSTANCE STATUS LAST_SEEN
    for dir in "$INSTANCES"/*/; do
        [ -f "$dir/instance.json" ] || continue
        grep -q '"status": "deleted"' "$dir/instance.json" && continue
        id="$(basename "$dir")"
        nstance-admin instance show "$id" -o json 2>/dev/null | python3 -c \
            'import json,sys; d=json.load(sys.stdin)[0]; print("%-32s %-12s %s" % (d["instance_id"], d["status"], d.get("last_seen", "-")))' 2>/dev/null \
            || printf '%-32s %s\n' "$id" "(not known to the server yet)"
    done
    echo
    echo "agent processes: $(pgrep -fc -- "--instance-dir $INSTANCES/" || true)"
    sleep 2
done
echo "nstance-server exited; last log lines:"
tail -n 20 "$STATE/server.log"
