// A launcher like `npm exec` (what `npx -y pkg` runs): a node process that starts the server
// through `sh -c` with its own stdio inherited, waits for it and passes on its exit status.
'use strict';
const { spawn } = require('child_process');

const child = spawn('sh', ['-c', `node ${process.argv[2]}`], { stdio: 'inherit' });
process.on('SIGTERM', () => child.kill('SIGTERM'));
child.on('exit', (code) => process.exit(code === null ? 1 : code));
