// A Node MCP host: starts stdio servers with child_process.spawn (libuv gives each child a
// UNIX socket pair for stdin, stdout and stderr), keeps talking to the active ones, and leaves
// the abandoned ones waiting with their sockets open.
//
//   node host.js TRUTH SPEC...     SPEC is STATE:HOW
//     STATE  active (a request every 200 ms) | abandoned (never a request)
//     HOW    direct   node server.js
//            sh       sh -c 'node server.js; true'  (the shell stays the parent)
//            script   wrapper.sh server.js           (a launcher script that stays)
//            npx      node wrapper.js server.js      (like npm exec: node > sh -c > node)
//            ignore   node server.js, stdio ignored and detached (internal pipes only)
//
// Once every server said hello it writes TRUTH: {"host": pid, "servers": [{"spec", "pid" (the
// process it spawned), "leaf" (the server.js process), "active"}]}. HOST_DIE=1: then it sends
// a request to each active server and SIGKILLs itself mid-request. Otherwise it ends when the
// test releases it (REAPER_SHAPES_RELEASE exists): it closes each server's stdin, signals it,
// and exits once they did.
'use strict';
const { spawn } = require('child_process');
const fs = require('fs');
const path = require('path');

const [truthFile, ...specs] = process.argv.slice(2);
const server = path.join(__dirname, 'server.js');
const how = {
  direct: () => ['node', [server]],
  sh: () => ['sh', ['-c', `node ${server}; true`]],
  script: () => [path.join(__dirname, 'wrapper.sh'), [server]],
  npx: () => ['node', [path.join(__dirname, 'wrapper.js'), server]],
  ignore: () => ['node', [server]],
};

const servers = specs.map((spec) => {
  const [state, kind] = spec.split(':');
  if (!how[kind] || !['active', 'abandoned'].includes(state)) {
    throw new Error(`bad server spec ${spec}`);
  }
  const [cmd, args] = how[kind]();
  const options = kind === 'ignore' ? { stdio: 'ignore', detached: true } : { stdio: 'pipe' };
  const child = spawn(cmd, args, options);
  const entry = { spec, pid: child.pid, leaf: kind === 'ignore' ? child.pid : null, active: state === 'active', child };
  if (child.stdout) {
    let seen = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (chunk) => {
      seen += chunk;
      const hello = /hello (\d+)\n/.exec(seen);
      if (entry.leaf === null && hello) {
        entry.leaf = Number(hello[1]);
        ready();
      }
    });
  }
  return entry;
});

let started = false;
function ready() {
  if (started || servers.some((s) => s.leaf === null)) return;
  started = true;
  const truth = {
    host: process.pid,
    servers: servers.map(({ spec, pid, leaf, active }) => ({ spec, pid, leaf, active })),
  };
  fs.writeFileSync(truthFile, JSON.stringify(truth));
  if (process.env.HOST_DIE === '1') {
    for (const s of servers.filter((s) => s.active && s.child.stdin)) s.child.stdin.write("ping\n");
    process.kill(process.pid, 'SIGKILL');
  }
}
ready(); // all `ignore`: nothing to wait for

let n = 0;
setInterval(() => {
  n += 1;
  for (const s of servers.filter((s) => s.active && s.child.stdin && s.leaf !== null)) {
    s.child.stdin.write(`ping ${n}\n`);
  }
}, 200);

const release = process.env.REAPER_SHAPES_RELEASE;
const cap = Date.now() + 1000 * Number(process.env.REAPER_SHAPES_HOLD_CAP_SECS || 300);
setInterval(() => {
  if (!((release && fs.existsSync(release)) || Date.now() > cap)) return;
  let left = servers.filter((s) => s.child.exitCode === null && s.child.signalCode === null);
  if (left.length === 0) process.exit(0);
  for (const s of left) {
    s.child.on('exit', () => {
      left = left.filter((x) => x !== s);
      if (left.length === 0) process.exit(0);
    });
    if (s.child.stdin) s.child.stdin.end();
    s.child.kill('SIGTERM');
  }
}, 100);
