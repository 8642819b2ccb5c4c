#!/bin/sh
# Run at boot by reaper-unit-check.service (after reaper-trace.service) in the root
# `dist/booted.rs` boots: says on the console how the package's unit fared, then powers off.
# Every line it says starts with "reaper-unit-check: "; the last is "reaper-unit-check: end".
say() { echo "reaper-unit-check: $*" > /dev/console; }
audit=/var/log/reaper/audit.ndjson
# The run is ready once its `ready` line is in the audit. A unit that fails is restarted
# (Restart=on-failure): its first restart ends the wait, as does a cap far past a slow boot.
waited=0
until grep -q '"event":"ready"' "$audit" 2>/dev/null; do
    [ "$(systemctl show -P NRestarts reaper-trace)" -gt 0 ] && break
    waited=$((waited + 1))
    [ "$waited" -gt 900 ] && break
    sleep 1
done
say "unit: $(systemctl show -P ActiveState reaper-trace) $(systemctl show -P SubState reaper-trace) restarts=$(systemctl show -P NRestarts reaper-trace)"
say "ready: $(grep -m1 -o '"setsid_hook":"[a-z_]*"' "$audit" 2>/dev/null)"
say "perf_event_paranoid: $(cat /proc/sys/kernel/perf_event_paranoid)"
main=$(systemctl show -P MainPID reaper-trace)
say "capabilities: $(grep -E '^(CapEff|CapPrm|NoNewPrivs):' "/proc/$main/status" 2>/dev/null | tr -s '\t\n' '  ')"
# Asked over the API the unit serves (its RuntimeDirectory).
say "why: $(reaper-trace why $$ 2>&1 | head -1)"
journalctl -u reaper-trace --no-pager -o cat 2>&1 | tail -n 20 | while read -r line; do
    say "journal: $line"
done
say end
systemctl poweroff --no-block
