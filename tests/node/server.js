// A stdio server as MCP hosts start them: a request a line on stdin, an answer a line on
// stdout. It says `hello PID` first, so the host learns its pid through any wrappers.
//
// SERVER_IGNORE_EOF=1: it keeps running when its stdin ends (a server that never notices its
// host is gone). It ends when the test releases it (the file REAPER_SHAPES_RELEASE exists),
// also as an orphan whose host is gone, or after REAPER_SHAPES_HOLD_CAP_SECS.
'use strict';
const fs = require('fs');

const release = process.env.REAPER_SHAPES_RELEASE;
const cap = Date.now() + 1000 * Number(process.env.REAPER_SHAPES_HOLD_CAP_SECS || 300);
// Servers shut down cleanly on SIGTERM (this also gives node its internal signal pipes).
process.on('SIGTERM', () => process.exit(0));

// An answer to a host that is gone fails with EPIPE: a server that outlives its host ignores
// that (the default would end it with an uncaught error).
process.stdout.on('error', () => {});
process.stdout.write(`hello ${process.pid}\n`);
let pending = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  pending += chunk;
  let at;
  while ((at = pending.indexOf('\n')) >= 0) {
    const request = pending.slice(0, at);
    pending = pending.slice(at + 1);
    process.stdout.write(`answer ${request}\n`);
  }
});
process.stdin.on('end', () => {
  if (process.env.SERVER_IGNORE_EOF !== '1') process.exit(0);
});
setInterval(() => {
  if ((release && fs.existsSync(release)) || Date.now() > cap) process.exit(0);
}, 100);
