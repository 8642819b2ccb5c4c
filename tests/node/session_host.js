// A per-session MCP host of the real MCP TypeScript SDK, as agent hosts run one per
// conversation (its session in its environment, `AGENT_SESSION_ID`). It starts a stdio
// server (`mcp_stdio_server.js`) through the SDK's `StdioClientTransport` and connects (the
// server answers `initialize`). Then it starts a helper that holds its server's stdin, as a
// tool's subprocess inherits a host's descriptors, behind a double fork (`sh -c 'sleep &'`:
// the wrapper is gone at once), writes `HOST HELPER` (pids) to PIDS, and stays until it is
// killed.
//
//     node session_host.js SDK_DIR SERVER_JS PIDS
//
// The SDK starts the server with its default environment (no session variable): the server
// is in its host's session by the lineage alone.
'use strict';
const { spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');

const [sdkDir, serverJs, pids] = process.argv.slice(2);

async function main() {
  const sdk = path.join(sdkDir, 'node_modules/@modelcontextprotocol/sdk/dist/cjs');
  const { Client } = require(path.join(sdk, 'client/index.js'));
  const { StdioClientTransport } = require(path.join(sdk, 'client/stdio.js'));
  const client = new Client({ name: 'reaper-test-host', version: '1.0.0' });
  const transport = new StdioClientTransport({ command: 'node', args: [serverJs, sdkDir] });
  await client.connect(transport);
  // The write end of the server's stdin, as this host holds it, given to the helper.
  const stdin = transport._process.stdin._handle.fd;
  const helperPid = `${pids}.helper`;
  const wrapper = spawnSync('sh', ['-c', 'sleep 3600 & echo $! > "$0"', helperPid], {
    stdio: ['ignore', stdin, 'inherit'],
  });
  if (wrapper.status !== 0) throw new Error(`the helper's wrapper failed: ${wrapper.status}`);
  const helper = fs.readFileSync(helperPid, 'utf8').trim();
  fs.writeFileSync(`${pids}.tmp`, `${process.pid} ${helper}\n`);
  fs.renameSync(`${pids}.tmp`, pids);
  setInterval(() => {}, 1 << 30);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
