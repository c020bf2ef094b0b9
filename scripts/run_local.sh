#!/usr/bin/env bash
# `make run`: a one-machine Nstance shard from examples/local/ on file:// storage.
#
# Sets up the cluster (CA, nonce key, shard config, an operator identity), starts nstance-server with
# the local provider (each instance is an nstance-agent process), scales the example group to 3 and
# shows the groups and instances live. Ctrl-C, or closing the terminal, stops the server, which stops
# every instance it started.
#
# One copy per state directory: a second `make run` finds the first one's lock (or, from another
# checkout, the ports in use) and exits without touching anything. The script only ever stops
# processes it started: the server by its pid, and, should the server die without stopping them, the
# agents recorded in its own state directory whose command line names their instance directory.
#
# State lives in .local/ (object storage in .local/storage, a development encryption key in
# .local/encryption.key, the server's cache in .local/cache). Re-running keeps the cluster: the CA is
# never overwritten. Expects the project's .venv/bin on PATH (the Makefile arranges that).
#
# Environment (for tests and experiments): NSTANCE_RUN_STATE (state directory, default .local),
# NSTANCE_RUN_CONFIG (default examples/local/config.jsonc), NSTANCE_RUN_REDRAW (live view interval,
# default 1s), NSTANCE_RUN_SIZE (size the group is scaled to, default 3).
set -euo pipefail
cd "$(dirname "$0")/.."

STATE="${NSTANCE_RUN_STATE:-.local}"
CONFIG="${NSTANCE_RUN_CONFIG:-examples/local/config.jsonc}"
REDRAW="${NSTANCE_RUN_REDRAW:-1s}"
SIZE="${NSTANCE_RUN_SIZE:-3}"
STORAGE="$STATE/storage"
HELPER="scripts/local_shard.py"

mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"
STORAGE="$STATE/storage"

# --- one copy at a time -------------------------------------------------------------------------
# The lock is held on fd 9 for the life of this script; every child is started with fd 9 closed, so
# an orphaned process can never keep it.
exec 9>>"$STATE/run.lock"
if ! flock -n 9; then
    other="$(cat "$STATE/run.pid" 2>/dev/null || true)"
    echo "make run is already running${other:+ (pid $other)} with its state in $STATE." >&2
    echo "Use that one (its live view is in the terminal that started it), or stop it with Ctrl-C there." >&2
    exit 1
fi
echo $$ >"$STATE/run.pid"

eval "$(python "$HELPER" settings "$CONFIG" 9>&-)"
if ! python "$HELPER" check-ports "$CONFIG" 9>&-; then
    echo "Another nstance-server (or a make run from another checkout) is using these ports; stop it first." >&2
    exit 1
fi

if [ ! -s "$STATE/encryption.key" ]; then
    (umask 077 && nstance-admin secrets generate-key >"$STATE/encryption.key.tmp" 9>&-)
    mv "$STATE/encryption.key.tmp" "$STATE/encryption.key"
    echo "generated a development encryption key in $STATE/encryption.key"
fi
NSTANCE_ENCRYPTION_KEY="$(cat "$STATE/encryption.key")"
export NSTANCE_ENCRYPTION_KEY
export NSTANCE_STORAGE=file NSTANCE_BUCKET="$STORAGE"

echo "== validating $CONFIG"
nstance-admin config validate "$CONFIG" 9>&-

echo "== initialising cluster '$CLUSTER' in $STORAGE"
nstance-admin cluster init --cluster-id "$CLUSTER" --exist-ok 9>&-

echo "== uploading the shard config"
nstance-admin config upload "$CONFIG" --shard "$SHARD" 9>&-

IDENTITY="$STATE/operator-identity"
if [ ! -s "$IDENTITY/identity.crt" ]; then
    echo "== registering an operator identity in $IDENTITY"
    nstance-admin cluster register-operator --cluster-id "$CLUSTER" --output-dir "$IDENTITY" 9>&-
fi

export NSTANCE_ADMIN_SERVERS="$SHARD=$OPERATOR_ADDR"
export NSTANCE_ADMIN_IDENTITY_DIR="$IDENTITY"
INSTANCES="$STATE/cache/local-instances"
SERVER_PID=""
VIEW_PID=""

stop_pid() {
    if [ -n "$1" ] && kill -0 "$1" 2>/dev/null; then
        kill -TERM "$1" 2>/dev/null || true
        wait "$1" 2>/dev/null || true
    fi
}

cleanup() {
    local status=$?
    # Stopping must finish once begun: a second Ctrl-C or hang-up is ignored (the server's own stop
    # is bounded by shard.shutdown_timeout), and after a hang-up the terminal is gone, so every message
    # fails and the stopping goes on regardless.
    trap '' INT TERM HUP
    trap - EXIT
    set +e
    stop_pid "$VIEW_PID"
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        printf '\n== stopping nstance-server (it stops the instances it started)\n'
        stop_pid "$SERVER_PID"
    fi
    # Should the server have died without stopping them: this run's own agents, and only those.
    python "$HELPER" stop-agents "$INSTANCES" 9>&- || true
    rm -f "$STATE/run.pid"
    echo "stopped (server log: $STATE/server.log)"
    exit "$status"
}
on_signal() {
    # Ignored from here on: a second signal ran this trap again in the middle of the EXIT trap's
    # stopping and ended the shell there (seen once in a few tries of the closed-terminal test, with
    # run.pid left behind).
    trap '' INT TERM HUP
    exit 0 # a Ctrl-C is the normal way to stop: the EXIT trap reports and exits cleanly
}
trap cleanup EXIT
# HUP: the terminal was closed. The server stops on it too (and stops its instances); the view dies.
trap on_signal INT TERM HUP

# The local provider's agents inherit the server's environment: report as often as the example's
# shard.health_check_interval (10s) expects, or they would count as silent after three intervals.
export NSTANCE_REPORT_INTERVAL=10s

echo "== starting nstance-server (log: $STATE/server.log)"
nstance-server --id local-1 --shard "$SHARD" --cachedir "$STATE/cache" \
    --health-addr "$HEALTH_ADDR" >>"$STATE/server.log" 2>&1 9>&- &
SERVER_PID=$!

server_died() {
    echo "nstance-server exited unexpectedly; the last lines of $STATE/server.log:" >&2
    tail -n 5 "$STATE/server.log" >&2
    SERVER_PID=""
    exit 1
}

wait_status=0
python "$HELPER" wait-leader "$HEALTH_ADDR" "$SERVER_PID" 9>&- || wait_status=$?
if [ "$wait_status" = 3 ]; then
    server_died
elif [ "$wait_status" != 0 ]; then
    echo "nstance-server did not become leader within 60s; see $STATE/server.log" >&2
    exit 1
fi
echo "== nstance-server is up and leads shard $SHARD"

echo "== scaling group 'app' to $SIZE"
nstance-admin group scale app "$SIZE" 9>&-

echo
echo "From a second terminal, with the same environment:"
echo "  export NSTANCE_ADMIN_SERVERS=$NSTANCE_ADMIN_SERVERS NSTANCE_ADMIN_IDENTITY_DIR=$IDENTITY"
echo "  .venv/bin/nstance-admin group scale app 5"
echo "Press Ctrl-C to stop everything."
sleep 2

# The live view runs in the background (so it ignores Ctrl-C, which this script handles) until the
# server or the view ends.
nstance-admin watch --interval "$REDRAW" --instances-dir "$INSTANCES" \
    --title "Nstance local shard $SHARD  (Ctrl-C stops the server and every instance)" 9>&- &
VIEW_PID=$!
wait -n "$SERVER_PID" "$VIEW_PID" || true
if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    wait "$SERVER_PID" 2>/dev/null || true
    stop_pid "$VIEW_PID"
    VIEW_PID=""
    server_died
fi
