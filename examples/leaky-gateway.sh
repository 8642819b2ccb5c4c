#!/usr/bin/env bash
# A tiny "gateway" that leaks the way real ones do, for trying reaper-trace without one:
#
#   cargo xtask demo     (= reaper-trace --duration 6s -- examples/leaky-gateway.sh)
#
# It runs two agent sessions, each a per-session process tagged with its session id in its
# environment (AGENT_SESSION_ID, as goose sets it; reaper-trace reads the hosts' variables by
# default). Session 1 is torn down properly. Session 2 starts a stdio "server" (cat, blocked
# reading its stdin) behind setsid and a double fork, fed by a pipe whose write end a "holder"
# (sleep) keeps open; then the session ends and nobody stops the server. It is reparented to
# init, so `ps --ppid` no longer links it to the gateway; reaper-trace still does, and says
# which session left it. The leak ends itself after LEAK_SECONDS (default 20), so the demo
# leaves nothing behind.
set -eu
leak_seconds=${LEAK_SECONDS:-20}

# What the caller left open (a shell's or a terminal's descriptors) is not this gateway's:
# closed, so that what reaper-trace shows is what the gateway made.
for fd in /proc/$$/fd/*; do
    n=${fd##*/}
    if [ "$n" -gt 2 ] 2>/dev/null; then eval "exec $n>&-"; fi
done

echo "gateway $$: session 1 (cleaned up)"
AGENT_SESSION_ID=demo-session-1 sh -c 'printf "request\n" | cat >/dev/null'

echo "gateway $$: session 2 (its stdio server escapes and is never torn down)"
# (An asynchronous command's stdin is /dev/null unless it is redirected: the server is given
# the pipe's read end by hand.)
AGENT_SESSION_ID=demo-session-2 sh -c \
    "sleep $leak_seconds 2>/dev/null | (exec 3<&0; setsid cat <&3 3<&- >/dev/null 2>&1 &) & sleep 1"

sleep 1
echo "gateway $$: sessions over, exiting"
