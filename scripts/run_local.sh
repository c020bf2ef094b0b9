#!/usr/bin/env bash
# `make run`: set up a one-machine Nstance cluster from examples/local/ on file:// storage.
#
# State lives in .local/ (object storage in .local/storage, a development encryption key in
# .local/encryption.key). Re-running keeps the existing cluster: the CA is never overwritten.
# Expects the project's .venv/bin on PATH (the Makefile arranges that).
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

echo "== signing an operator registration nonce"
nstance-admin --temp-dir "$STATE" cluster nonce --cluster-id "$CLUSTER" \
    --storage-provider file --storage-bucket "$STORAGE" --expiry 3h

echo
echo "Local cluster '$CLUSTER' is ready in $STORAGE:"
find "$STORAGE" -path "$STORAGE/.nstance-locks" -prune -o -type f -print | sort | sed 's/^/  /'
echo "The shard server (nstance-server) arrives in the next release; this run set up what it needs."
