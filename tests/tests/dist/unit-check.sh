#!/bin/sh
# Run at boot by reaper-unit-check.service (after reaper-trace.service) in the root
# `dist/booted.rs` boots: says on the console how the package's unit fared, then powers off.
# Every line it says starts with "reaper-unit-check: "; the last is "reaper-unit-check: end".
say() { echo "reaper-unit-check: $*" > /dev/console; }
audit=/var/log/reaper/audit.ndjson
state() { systemctl show -P ActiveState reaper-trace; }
restarts() { systemctl show -P NRestarts reaper-trace; }
# The run is ready once its `ready` line is in the audit. A unit that failed, ended or was
# restarted (Restart=on-failure) ends the wait, as does a cap far past a slow boot's.
until=$(($(date +%s) + 600))
until grep -q '"event":"ready"' "$audit" 2>/dev/null; do
    case "$(state)" in failed | inactive) break ;; esac
    [ "$(restarts)" -gt 0 ] && break
    [ "$(date +%s)" -gt "$until" ] && { say "waited 600 s for the ready line"; break; }
    sleep 1
done
say "ready: $(grep -m1 -o '"setsid_hook":"[a-z_]*"' "$audit" 2>/dev/null)"
# It stays up: still running, never restarted, a while after it was ready.
sleep 15
say "unit: $(state) $(systemctl show -P SubState reaper-trace) restarts=$(restarts)"
say "perf_event_paranoid: $(cat /proc/sys/kernel/perf_event_paranoid)"
main=$(systemctl show -P MainPID reaper-trace)
grep -E '^(CapEff|CapPrm|NoNewPrivs):' "/proc/$main/status" 2>/dev/null |
    while read -r name value; do say "$name $value"; done
# Asked over the API the unit serves (its RuntimeDirectory): this script is no gateway's.
why=$(reaper-trace why $$ 2>&1)
status=$?
say "why: exit $status $(echo "$why" | head -n 1)"
journalctl -u reaper-trace --no-pager -o cat 2>&1 | tail -n 20 | while read -r line; do
    say "journal: $line"
done
say end
systemctl poweroff --no-block
