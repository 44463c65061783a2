// The chat app's own server: serves the built page (dist/<set>/) and two routes.
//
//   GET  /api/access?chat=<id>  -> {gateway, token}: the gateway's address and a
//                                  subscriber token scoped to that chat (session) only
//   POST /api/chat              -> the AI SDK's send: claims a run in the chat's session
//                                  with the user's message as input_message, publishes
//                                  each UI message chunk as an event named `ui`, ENDs
//                                  it, and streams the same chunks to the browser
//
// Environment: GATEWAY_URL (default http://127.0.0.1:8000; GATEWAY_PUBLIC_URL, when set,
// is the address browsers are given instead), GATEWAY_API_KEY (producer
// routes; unset for an open loopback gateway), GATEWAY_JWT_SECRET (the gateway's secret
// for subscriber tokens; unset: no token, an open gateway), HOST (127.0.0.1), PORT
// (3000; 0 picks a free one), CHAT_AI_SET (ai6 or ai7: which build to serve),
// CHAT_WORDS (24) and CHAT_WORD_DELAY_MS (150): the stand-in model's answer.
// Prints "listening on <url>" once it serves.
import { readFile } from "node:fs/promises";
import { createServer } from "node:http";
import { extname, join, normalize, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { SignJWT } from "jose";
import { fakeModel } from "./model.mjs";

const env = process.env;
const GATEWAY = (env.GATEWAY_URL ?? "http://127.0.0.1:8000").replace(/\/$/, "");
const PUBLIC_GATEWAY = (env.GATEWAY_PUBLIC_URL ?? GATEWAY).replace(/\/$/, "");
const API_KEY = env.GATEWAY_API_KEY;
const JWT_SECRET = env.GATEWAY_JWT_SECRET;
const WORDS = Number(env.CHAT_WORDS ?? 24);
const DELAY_MS = Number(env.CHAT_WORD_DELAY_MS ?? 150);
const DIST = fileURLToPath(new URL(`./dist/${env.CHAT_AI_SET ?? "ai6"}/`, import.meta.url));
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml" };

// -- the gateway's producer API ---------------------------------------------------------

async function gatewayPost(path, body, headers = {}) {
  const response = await fetch(`${GATEWAY}${path}`, {
    method: "POST",
    headers: {
      "Content-Type": "application/json",
      ...(API_KEY ? { Authorization: `Bearer ${API_KEY}` } : {}),
      ...headers,
    },
    body: JSON.stringify(body),
  });
  const reply = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(`gateway ${path}: ${response.status} ${reply.error ?? ""} ${reply.detail ?? ""}`);
    error.status = response.status;
    throw error;
  }
  return reply;
}

/** One answer = one run: numbered appends (a retried batch is never applied twice). */
class GatewayRun {
  static async claim(sessionId, inputMessage) {
    const claim = await gatewayPost("/v1/runs", { session_id: sessionId, input_message: inputMessage });
    return new GatewayRun(claim);
  }

  constructor(claim) {
    this.runId = claim.run_id;
    this.headers = { "X-Producer-Token": claim.producer_token };
    this.seq = 0;
  }

  async publish(chunk) {
    const seq = String(++this.seq);
    const body = { event: "ui", data: chunk };
    for (let attempt = 1; ; attempt++) {
      try {
        return await gatewayPost(`/v1/runs/${this.runId}/events`, body, { ...this.headers, "X-Producer-Seq": seq });
      } catch (err) {
        // the same number again: applied once, whichever reply was lost
        if (attempt >= 3 || (err.status !== undefined && err.status !== 503)) throw err;
        await new Promise((resolve) => setTimeout(resolve, 200 * attempt));
      }
    }
  }

  end(status, error) {
    return gatewayPost(`/v1/runs/${this.runId}/end`, error ? { status, error } : { status }, this.headers);
  }
}

// -- routes -------------------------------------------------------------------------------

function json(res, status, body) {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify(body));
}

async function readJson(req) {
  let raw = "";
  for await (const piece of req) raw += piece;
  return JSON.parse(raw);
}

const textOf = (message) =>
  (message.parts ?? []).filter((p) => p.type === "text").map((p) => p.text).join("");

async function access(req, res, url) {
  // A real app checks here that its signed-in user may read this chat.
  const chat = url.searchParams.get("chat");
  if (!chat) return json(res, 400, { error: "invalid_input", detail: "chat is required" });
  const token = JWT_SECRET
    ? await new SignJWT({ sessions: [chat], runs: [] })
        .setProtectedHeader({ alg: "HS256" })
        .setIssuedAt()
        .setExpirationTime("1h")
        .sign(new TextEncoder().encode(JWT_SECRET))
    : null;
  return json(res, 200, { gateway: PUBLIC_GATEWAY, token });
}

// The UI message chunks of one text answer (what streamText(...).toUIMessageStream()
// yields for a plain text reply). The message id is the run id: the live message, the
// replayed one and the history's assistant message are one message.
async function* uiChunks(runId, textDeltas) {
  yield { type: "start", messageId: runId };
  yield { type: "start-step" };
  yield { type: "text-start", id: "text" };
  for await (const delta of textDeltas) yield { type: "text-delta", id: "text", delta };
  yield { type: "text-end", id: "text" };
  yield { type: "finish-step" };
  yield { type: "finish" };
}

async function chat(req, res) {
  let body;
  try {
    body = await readJson(req);
  } catch {
    return json(res, 400, { error: "invalid_json", detail: "the body is not JSON" });
  }
  const { id, messages } = body ?? {};
  const last = Array.isArray(messages) ? messages.at(-1) : undefined;
  if (typeof id !== "string" || last?.role !== "user") {
    return json(res, 400, { error: "invalid_input", detail: "expected {id, messages} ending with a user message" });
  }
  const prompt = textOf(last);
  let run;
  try {
    run = await GatewayRun.claim(id, {
      messageId: last.id,
      role: "user",
      parts: [{ kind: "text", text: prompt }],
    });
  } catch (err) {
    return json(res, 502, { error: "gateway_error", detail: err.message });
  }

  // The same chunks go to the browser that asked. If it leaves (a reload, a closed tab,
  // a lost network) the answer goes on: the gateway keeps it for every reader.
  res.writeHead(200, {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "x-vercel-ai-ui-message-stream": "v1",
  });
  const toBrowser = (frame) => {
    if (!res.destroyed && !res.writableEnded) res.write(frame);
  };
  try {
    for await (const chunk of uiChunks(run.runId, fakeModel(prompt, { words: WORDS, delayMs: DELAY_MS }))) {
      if (chunk.type === "error") throw new Error(chunk.errorText); // a model's error, as a chunk
      await run.publish(chunk);
      toBrowser(`data: ${JSON.stringify(chunk)}\n\n`);
    }
    await run.end("success");
    toBrowser("data: [DONE]\n\n");
  } catch (err) {
    // The ending is the truth: a failed answer ENDs `error` with the reason, never
    // `success` with whatever text came before.
    const message = err instanceof Error ? err.message : String(err);
    await run.end("error", { message }).catch((endErr) => console.error("END failed:", endErr.message));
    toBrowser(`data: ${JSON.stringify({ type: "error", errorText: message })}\n\n`);
  }
  if (!res.writableEnded) res.end();
}

async function staticFile(res, pathname) {
  const relative = normalize(pathname === "/" ? "/index.html" : pathname).slice(1);
  const file = join(DIST, relative);
  if (!file.startsWith(DIST) || relative.split(sep).includes("..")) return json(res, 404, { error: "not_found", detail: pathname });
  try {
    const content = await readFile(file);
    res.writeHead(200, { "Content-Type": TYPES[extname(file)] ?? "application/octet-stream" });
    res.end(content);
  } catch {
    json(res, 404, { error: "not_found", detail: pathname });
  }
}

const server = createServer((req, res) => {
  const url = new URL(req.url, "http://app");
  let handled;
  if (url.pathname === "/api/chat" && req.method === "POST") handled = chat(req, res);
  else if (url.pathname === "/api/access" && req.method === "GET") handled = access(req, res, url);
  else if (req.method === "GET") handled = staticFile(res, url.pathname);
  else handled = Promise.resolve(json(res, 405, { error: "method_not_allowed", detail: req.method }));
  handled.catch((err) => {
    console.error(err);
    if (!res.headersSent) json(res, 500, { error: "internal", detail: "see the server log" });
    else res.end();
  });
});

server.listen(Number(env.PORT ?? 3000), env.HOST ?? "127.0.0.1", () => {
  const { address, port } = server.address();
  console.log(`listening on http://${address}:${port}`);
});
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(0));
