// A Node MCP host for reaper's spawn-site tests: it starts one stdio server from a named
// function and holds it until released, through the real MCP TypeScript SDK's
// `StdioClientTransport` (`@modelcontextprotocol/sdk`) or through `child_process.spawn`.
//
//     node spawning_host.js HOW TRIGGER RELEASE
//
// HOW: `sdk:DIR` (DIR holds `node_modules/@modelcontextprotocol/sdk`), `spawn` (from an event
// loop callback, as a host serves a request), or `shallow` (from the script's own top level,
// a few KiB under the stack's top). The server reads its requests and never answers (`dd
// of=/dev/null`): the SDK's connect waits on it, as a host waits on a server stuck before
// `initialize`. The host runs `true` first (its fork tells the test the host was looked at),
// waits for TRIGGER, starts the server, and ends once RELEASE exists.
'use strict';
const { spawn, spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');

const [how, trigger, release] = process.argv.slice(2);
const server = ['dd', ['of=/dev/null', 'status=none']];

function whenExists(file) {
  return new Promise((resolve) => {
    const timer = setInterval(() => {
      if (fs.existsSync(file)) {
        clearInterval(timer);
        resolve();
      }
    }, 10);
  });
}

async function connectToServer(sdkDir) {
  const sdk = path.join(sdkDir, 'node_modules/@modelcontextprotocol/sdk/dist/cjs');
  const { Client } = require(path.join(sdk, 'client/index.js'));
  const { StdioClientTransport } = require(path.join(sdk, 'client/stdio.js'));
  const client = new Client({ name: 'reaper-test-host', version: '1.0.0' });
  const transport = new StdioClientTransport({ command: server[0], args: server[1] });
  // Never answered: the connect waits until the host ends (the SDK's timeout, raised past
  // any test's length, would otherwise close the transport).
  client.connect(transport, { timeout: 3600 * 1000 }).catch(() => {});
  return () => transport.close();
}

function startServer() {
  const child = spawn(server[0], server[1], { stdio: ['pipe', 'pipe', 'inherit'] });
  return async () => child.kill();
}

async function main() {
  spawnSync('true');
  let stop;
  if (how === 'shallow') {
    // Waits without returning to the event loop: the spawn below runs on the script's own
    // frames, near the top of the main thread's stack.
    const nap = new Int32Array(new SharedArrayBuffer(4));
    while (!fs.existsSync(trigger)) Atomics.wait(nap, 0, 0, 10);
    stop = startServer();
  } else {
    await whenExists(trigger);
    stop = how === 'spawn' ? startServer() : await connectToServer(how.slice('sdk:'.length));
  }
  await whenExists(release);
  await stop();
  process.exit(0);
}

main();
