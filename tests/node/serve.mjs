// `step35 serve` for the client tests. The server takes a free port (--port 0) and the test
// reads it from the server's "listening on" line, so runs in parallel (other worktrees,
// other builds) never collide. The server's log goes on to ours, and the server is killed
// on every way out of the test (normal exit, uncaught exception, rejected promise).
import { spawn } from 'node:child_process';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts the server on `model` (a GGUF path, or 'builtin') with extra arguments and resolves once /health answers 200,
// with { base } (http://127.0.0.1:PORT) and terminate(), which sends SIGTERM and resolves
// with how the process ended: { code, signal }, or null if it still ran after 10 s.
export async function startServer(binary, model, args = []) {
  // 'builtin': no -m, the server's built-in tiny model.
  const modelArgs = model === 'builtin' ? [] : ['-m', model];
  const server = spawn(binary, ['serve', ...modelArgs, '--port', '0', ...args],
                       { stdio: ['ignore', 'inherit', 'pipe'] });
  let port = null;
  let logged = '';
  server.stderr.on('data', (chunk) => {
    process.stderr.write(chunk);
    if (port === null) {
      logged += chunk.toString();
      const m = logged.match(/listening on http:\/\/[^:\s]+:(\d+)/);
      if (m) port = Number(m[1]);
    }
  });
  let exited = null;
  server.on('exit', (code, signal) => { exited = { code, signal }; });
  const killServer = () => { if (exited === null) server.kill('SIGKILL'); };
  process.on('exit', killServer);
  process.on('uncaughtException', (e) => { console.error(e); killServer(); process.exit(1); });
  process.on('unhandledRejection', (e) => { console.error(e); killServer(); process.exit(1); });

  for (let i = 0; port === null; ++i) {
    if (i > 200 || exited) throw new Error('server did not start listening');
    await sleep(50);
  }
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; ; ++i) {
    try {
      if ((await fetch(`${base}/health`)).status === 200) break;
    } catch {}
    if (i > 200 || exited) throw new Error('server did not start');
    await sleep(50);
  }
  return {
    base,
    // Kills the server at once (SIGKILL), as a crash would.
    kill() { killServer(); },
    async terminate() {
      server.kill('SIGTERM');
      for (let i = 0; exited === null && i < 400; ++i) await sleep(25);
      return exited;
    },
  };
}
