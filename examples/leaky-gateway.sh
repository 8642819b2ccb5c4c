#!/bin/sh
# A tiny "gateway" that leaks the way real ones do, for trying reaper-trace without one:
#
#   cargo xtask demo     (= reaper-trace --duration 6s -- examples/leaky-gateway.sh)
#
# Session 1 is torn down properly. Session 2 starts a stdio "server" (cat, blocked reading
# its stdin) behind setsid and a double fork, fed by a pipe whose write end a "holder"
# (sleep) keeps open; then the session ends and nobody stops the helper. It is reparented to
# init, so `ps --ppid` no longer links it to the gateway; reaper-trace still does.
# The leak cleans itself up after LEAK_SECONDS (default 20), so the demo leaves nothing behind.
set -eu
leak_seconds=${LEAK_SECONDS:-20}

echo "gateway $$: session 1 (cleaned up)"
printf 'request\n' | cat >/dev/null

echo "gateway $$: session 2 (its helper escapes and is never torn down)"
( setsid sh -c "sleep $leak_seconds | cat" & )

sleep 1
echo "gateway $$: sessions over, exiting"
