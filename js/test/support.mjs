// Test support: a real gateway process, a delaying TCP relay, a buffering HTTP proxy.
import { spawn, execFileSync } from "node:child_process";
import { createServer as createHttpServer } from "node:http";
import { createServer, connect } from "node:net";
import { fileURLToPath } from "node:url";

export const API_KEY = "js-package-key-0123456789";
export const APP_KID = "app1";
export const APP_SECRET = "app-secret-with-at-least-thirty-two-bytes!";
const GATEWAY_BIN = process.env.GATEWAY_BIN ?? fileURLToPath(new URL("../../.venv/bin/gateway", import.meta.url));

let help;
/** Whether this gateway has a setting (its `serve --help` names the flag). */
export function gatewayHas(flag) {
  help ??= execFileSync(GATEWAY_BIN, ["serve", "--help"], { encoding: "utf8" });
  return help.includes(flag);
}

export async function freePort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** A `redis-server` on a free port (no persistence), or null when none is installed. */
export async function startRedis() {
  try {
    execFileSync("redis-server", ["--version"], { stdio: "ignore" });
  } catch {
    return null;
  }
  const port = await freePort();
  const proc = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], {
    stdio: "ignore",
  });
  const deadline = Date.now() + 10_000;
  for (;;) {
    const up = await new Promise((resolve) => {
      const socket = connect(port, "127.0.0.1", () => {
        socket.end();
        resolve(true);
      });
      socket.on("error", () => resolve(false));
    });
    if (up) break;
    if (Date.now() > deadline || proc.exitCode !== null) throw new Error("redis-server did not start");
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    async stop() {
      if (proc.exitCode !== null) return;
      proc.kill("SIGTERM");
      await new Promise((resolve) => proc.once("exit", resolve));
    },
  };
}

/** Starts `gateway serve` (memory bridge unless GATEWAY_REDIS_URL is given) on a free port; `stop()` ends it. */
export async function startGateway(extraEnv = {}) {
  const port = await freePort();
  const env = {
    ...process.env,
    GATEWAY_API_KEYS: API_KEY,
    GATEWAY_HEARTBEAT_INTERVAL_SECONDS: "1",
    
    ...(gatewayHas("--jwt-app-keys") ? { GATEWAY_JWT_APP_KEYS: `${APP_KID}:${APP_SECRET}` } : {}),
    ...extraEnv,
  };
  const proc = spawn(GATEWAY_BIN, ["serve", "--host", "127.0.0.1", "--port", String(port)], {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  proc.stdout.on("data", (d) => (log += d));
  proc.stderr.on("data", (d) => (log += d));
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`the gateway exited: ${log}`);
    try {
      if ((await fetch(`${url}/healthz`)).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`the gateway did not start: ${log}`);
    await new Promise((resolve) => setTimeout(resolve, 50)); // a process start: nothing to await
  }
  return {
    url,
    port,
    log: () => log,
    async stop() {
      if (proc.exitCode !== null) return;
      proc.kill("SIGTERM");
      await new Promise((resolve) => proc.once("exit", resolve));
    },
  };
}

/** JSON against the gateway with the API key. */
export async function api(gateway, method, path, body) {
  const response = await fetch(gateway.url + path, {
    method,
    headers: { Authorization: `Bearer ${API_KEY}`, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : null };
}

/**
 * A TCP relay to `port` that delays every piece of data by `delayMs` in each direction
 * (order kept, throughput not limited), like a gateway 2 x delayMs away. `cut()` resets
 * every open connection.
 */
export async function startRelay(port, delayMs = 0) {
  const open = new Set();
  const server = createServer((client) => {
    const upstream = connect(port, "127.0.0.1");
    open.add(client).add(upstream);
    const pipe = (from, to) => {
      from.on("data", (data) => {
        if (delayMs === 0) to.write(data);
        else setTimeout(() => to.writable && to.write(data), delayMs);
      });
      from.on("end", () => setTimeout(() => to.end(), delayMs));
      from.on("error", () => to.destroy());
      from.on("close", () => {
        open.delete(from);
        setTimeout(() => to.destroy(), delayMs);
      });
    };
    pipe(client, upstream);
    pipe(upstream, client);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    cut() {
      for (const socket of open) socket.resetAndDestroy();
      open.clear();
    },
    async close() {
      for (const socket of open) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/**
 * An HTTP proxy that buffers: it reads a request's whole body before forwarding it and
 * the whole response before answering (a proxy with request and response buffering on).
 */
export async function startBufferingProxy(target) {
  const seen = { streamed: 0, batches: 0 };
  const server = createHttpServer(async (req, res) => {
    const pieces = [];
    try {
      for await (const piece of req) pieces.push(piece);
    } catch {
      return; // the client gave up on this request (the producer's fallback)
    }
    if (req.headers["content-type"]?.startsWith("application/x-ndjson")) seen.streamed++;
    else if (req.url.endsWith("/events")) seen.batches++;
    const headers = { ...req.headers };
    delete headers["transfer-encoding"];
    delete headers.host;
    delete headers.connection;
    try {
      const response = await fetch(target + req.url, {
        method: req.method,
        headers,
        body: pieces.length ? Buffer.concat(pieces) : undefined,
      });
      const body = Buffer.from(await response.arrayBuffer());
      res.writeHead(response.status, { "Content-Type": response.headers.get("content-type") ?? "text/plain" });
      res.end(body);
    } catch {
      res.writeHead(502).end();
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    seen,
    async close() {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** Reads a run's SSE from the gateway until END: `{events: [{id, event, data, at}], status}`. */
export async function readRun(gateway, runId, { onEvent } = {}) {
  const { readSSE } = await import("../dist/sse.js");
  const response = await fetch(`${gateway.url}/v1/runs/${runId}/stream`, {
    headers: { Authorization: `Bearer ${API_KEY}`, Accept: "text/event-stream" },
  });
  if (!response.ok) throw new Error(`stream ${runId}: ${response.status}`);
  const events = [];
  for await (const frame of readSSE(response.body)) {
    if (frame.event === "end") return { events, status: JSON.parse(frame.data).status };
    const item = { id: frame.id, event: frame.event, data: JSON.parse(frame.data), at: performance.now() };
    events.push(item);
    onEvent?.(item);
  }
  throw new Error(`stream ${runId} ended without an END`);
}

/** Resolves when `predicate()` holds, polling every 20 ms; rejects after `ms`. */
export async function until(predicate, ms = 10_000, what = "condition") {
  const deadline = Date.now() + ms;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
