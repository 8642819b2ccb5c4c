// A stdio MCP server of the real MCP TypeScript SDK (`McpServer` over `StdioServerTransport`),
// as agent hosts start one per session: its command line is the same in every session.
//
//     node mcp_stdio_server.js SDK_DIR
//
// SDK_DIR holds `node_modules/@modelcontextprotocol/sdk`. It serves until its stdin ends.
'use strict';
const path = require('path');

const sdk = path.join(process.argv[2], 'node_modules/@modelcontextprotocol/sdk/dist/cjs');
const { McpServer } = require(path.join(sdk, 'server/mcp.js'));
const { StdioServerTransport } = require(path.join(sdk, 'server/stdio.js'));

const server = new McpServer({ name: 'reaper-test-server', version: '1.0.0' });
server.connect(new StdioServerTransport()).catch((e) => {
  console.error(e);
  process.exit(1);
});
