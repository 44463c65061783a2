// bench/token_stream.py's third server: the part of the gateway's HTTP API that the bench
// drives, served by Vercel's `resumable-stream` (2.x) over the `redis` client.
//
//     node server.mjs --port P --redis-url redis://127.0.0.1:6379/0
//
// - POST /v1/runs {"run_id"}: a ReadableStream of strings (its controller kept per run)
//   becomes the resumable stream `run_id` (ctx.createNewResumableStream: SUBSCRIBE to
//   the stream's request channel, SET of its sentinel key). The copy it returns, the
//   original requester's, is drained here and discarded. 201 {"producer_token"}.
// - POST /v1/runs/{id}/events {"event", "data"} (or {"events": [...]}): one SSE frame
//   per event (`id:`, `event:`, `data:` compact JSON) enqueued as one chunk; the library
//   PUBLISHes each chunk once per resumer, on that resumer's own channel. 200 {"ids"}.
// - POST /v1/runs/{id}/end {"status"}: enqueues the gateway's END frame (`id: end`,
//   `event: end`) and closes the stream (the library SETs the sentinel to DONE and
//   PUBLISHes its done message to every resumer). 200.
// - GET /v1/runs/{id}/stream: ctx.resumeExistingStream(id) (GET of the sentinel,
//   SUBSCRIBE to a fresh listener channel, PUBLISH of a request the producer answers
//   with the buffered chunks; from then on a GET of the sentinel every 10 s, its done
//   watchdog), written to the response chunk by chunk as it arrives. 404 if the stream
//   never existed, 422 if it is done (the library's README answer).
//
// The events live only in the producer's process (the library's chunk buffer); Redis
// holds the sentinel key and carries the pub/sub, nothing else. No lease, no producer
// token check, no Last-Event-ID: the bench needs none of them.
// Only dependencies: resumable-stream and redis.

import http from "node:http";
import { createClient } from "redis";
import { createResumableStreamContext } from "resumable-stream";

function parseArgs(argv) {
  const args = { port: 8000, redisUrl: process.env.REDIS_URL || "redis://127.0.0.1:6379" };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (flag === "--port" && value !== undefined) {
      args.port = Number.parseInt(value, 10);
      i++;
    } else if (flag === "--redis-url" && value !== undefined) {
      args.redisUrl = value;
      i++;
    } else {
      console.error(`usage: node server.mjs --port P --redis-url URL (got ${flag})`);
      process.exit(2);
    }
  }
  if (!Number.isInteger(args.port) || args.port <= 0) {
    console.error("--port needs a port number");
    process.exit(2);
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));

// The library calls connect() only on clients it creates itself: connect ours first.
const publisher = createClient({ url: args.redisUrl });
const subscriber = createClient({ url: args.redisUrl });
for (const client of [publisher, subscriber]) {
  client.on("error", (err) => console.error("redis:", err));
}
await Promise.all([publisher.connect(), subscriber.connect()]);

const ctx = createResumableStreamContext({
  // A long-lived server: nothing to keep alive past a response (the types' advice).
  waitUntil: null,
  publisher,
  subscriber,
});

const runs = new Map(); // run_id -> the ReadableStream controller its producer routes feed
let seq = 0;

function sendJson(res, status, value) {
  const body = JSON.stringify(value);
  res.writeHead(status, {
    "Content-Type": "application/json",
    "Content-Length": Buffer.byteLength(body),
  });
  res.end(body);
}

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString("utf8");
  return text ? JSON.parse(text) : {};
}

async function drain(stream) {
  const reader = stream.getReader();
  while (!(await reader.read()).done);
}

async function claim(req, res) {
  const body = await readJson(req);
  const runId = body.run_id || crypto.randomUUID();
  if (runs.has(runId)) return sendJson(res, 409, { error: "run exists" });
  let controller;
  const source = new ReadableStream({
    start(c) {
      controller = c;
    },
  });
  runs.set(runId, controller);
  const own = await ctx.createNewResumableStream(runId, () => source);
  if (own) {
    drain(own).catch((err) => console.error("drain:", err));
  }
  sendJson(res, 201, { run_id: runId, producer_token: "resumable-stream" });
}

async function publish(req, res, runId) {
  const body = await readJson(req);
  const controller = runs.get(runId);
  if (controller === undefined) return sendJson(res, 404, { error: "no such run" });
  const events = Array.isArray(body.events) ? body.events : [body];
  const ids = [];
  let frames = "";
  for (const event of events) {
    const id = `${Date.now()}-${seq++}`;
    ids.push(id);
    frames += `id: ${id}\nevent: ${event.event}\ndata: ${JSON.stringify(event.data ?? null)}\n\n`;
  }
  controller.enqueue(frames);
  sendJson(res, 200, { ids, cancel_requested: false });
}

async function end(req, res, runId) {
  const body = await readJson(req);
  const controller = runs.get(runId);
  if (controller === undefined) return sendJson(res, 404, { error: "no such run" });
  runs.delete(runId);
  const status = typeof body.status === "string" ? body.status : "success";
  controller.enqueue(`id: end\nevent: end\ndata: ${JSON.stringify({ status })}\n\n`);
  controller.close();
  sendJson(res, 200, { id: "end", deduplicated: false });
}

async function stream(req, res, runId) {
  const resumed = await ctx.resumeExistingStream(runId);
  if (resumed === undefined) return sendJson(res, 404, { error: "no such run" });
  if (resumed === null) return sendJson(res, 422, { error: "stream is already done" });
  res.writeHead(200, {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
  });
  res.flushHeaders();
  const reader = resumed.getReader();
  let closed = false;
  res.on("close", () => {
    closed = true;
    reader.cancel().catch(() => {});
  });
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done || closed) break;
      if (value && !res.write(value)) {
        await new Promise((resolve) => {
          res.once("drain", resolve);
          res.once("close", resolve);
        });
      }
    }
  } catch (err) {
    if (!closed) console.error("stream:", err);
  }
  if (!closed) res.end();
}

const server = http.createServer({ noDelay: true }, (req, res) => {
  const url = new URL(req.url, "http://localhost");
  const parts = url.pathname.split("/").filter(Boolean).map(decodeURIComponent);
  let handled;
  if (parts[0] === "v1" && parts[1] === "runs") {
    if (parts.length === 2 && req.method === "POST") handled = claim(req, res);
    else if (parts.length === 4 && parts[3] === "events" && req.method === "POST")
      handled = publish(req, res, parts[2]);
    else if (parts.length === 4 && parts[3] === "end" && req.method === "POST")
      handled = end(req, res, parts[2]);
    else if (parts.length === 4 && parts[3] === "stream" && req.method === "GET")
      handled = stream(req, res, parts[2]);
  } else if (url.pathname === "/healthz") {
    return sendJson(res, 200, { ok: true });
  }
  if (handled === undefined) return sendJson(res, 404, { error: "not found" });
  handled.catch((err) => {
    console.error(`${req.method} ${url.pathname}:`, err);
    if (res.headersSent) return res.destroy();
    sendJson(res, err instanceof SyntaxError ? 400 : 500, { error: String(err) });
  });
});

server.listen(args.port, "127.0.0.1", () => {
  console.log(`resumable-stream server on 127.0.0.1:${args.port}, redis ${args.redisUrl}`);
});

for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => process.exit(0));
}
