// The chat app's own server on @gateway/ai: serves the built page (dist/<set>/) and
//   GET  /api/access?chat=<id> -> {gatewayUrl, token}: a short reader token for that chat,
//                                 only if this browser's user owns it
//   POST /api/chat             -> useChat's send (same-origin JSON, bounded): claims the
//                                 turn (the user message id is its idempotency key) and
//                                 publishes the model's UI message stream into it; 202 {runId}
// Environment: GATEWAY_URL (http://127.0.0.1:8000), GATEWAY_PUBLIC_URL (what browsers are
// given; GATEWAY_URL by default), GATEWAY_API_KEY, GATEWAY_APP_KID + GATEWAY_APP_SECRET (the
// app's own token key on the gateway; unset: no token, an open gateway), HOST, PORT (3000;
// 0: any), CHAT_AI_SET (ai6 | ai7), CHAT_WORDS (24), CHAT_WORD_DELAY_MS (150).
import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import { createServer } from "node:http";
import { extname, join, normalize, sep } from "node:path";
import { fileURLToPath } from "node:url";
import * as gw from "@gateway/ai/server";
import { fakeUIMessageStream } from "./model.mjs";

const env = process.env;
const GATEWAY = env.GATEWAY_URL ?? "http://127.0.0.1:8000";
const gateway = { gatewayUrl: GATEWAY, apiKey: env.GATEWAY_API_KEY };
const model = { words: Number(env.CHAT_WORDS ?? 24), delayMs: Number(env.CHAT_WORD_DELAY_MS ?? 150) };
const DIST = fileURLToPath(new URL(`./dist/${env.CHAT_AI_SET ?? "ai6"}/`, import.meta.url));
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css" };

// Ownership, as a demo: each browser is a user (a random id in an HttpOnly cookie) and a
// chat belongs to the user who opened it first. A real app asks its own sign-in and database.
const owners = new Map();
function owns(req, res, chatId) {
  let user = /(?:^|;\s*)uid=([\w-]{36})/.exec(req.headers.cookie ?? "")?.[1];
  if (!user) {
    user = randomUUID();
    res.setHeader("Set-Cookie", `uid=${user}; HttpOnly; SameSite=Lax; Path=/`);
  }
  if (!owners.has(chatId)) owners.set(chatId, user);
  return owners.get(chatId) === user;
}

async function access(req, res, url) {
  const chat = url.searchParams.get("chat") ?? "";
  if (!/^[\w.:-]{1,200}$/.test(chat)) throw new gw.RequestError(400, "invalid_input", "chat is required");
  if (!owns(req, res, chat)) throw new gw.RequestError(403, "forbidden", "not your chat");
  const token = env.GATEWAY_APP_SECRET
    ? await gw.mintReaderToken({ kid: env.GATEWAY_APP_KID, secret: env.GATEWAY_APP_SECRET, sessions: [chat], ttlSeconds: 900 })
    : null;
  return Response.json({ gatewayUrl: env.GATEWAY_PUBLIC_URL ?? GATEWAY, token });
}

async function chat(req, res) {
  const { id, message, idempotencyKey } = await gw.readChatRequest(req, { maxBytes: 256 * 1024, origin: `http://${req.headers.host}` });
  if (!owns(req, res, id)) throw new gw.RequestError(403, "forbidden", "not your chat");
  const text = gw.textOf(message);
  const turn = await gw.claimTurn({
    ...gateway,
    sessionId: id,
    inputMessage: { messageId: message.id, role: "user", parts: [{ kind: "text", text }] },
    idempotencyKey, // the message id: a double submit or a retried request follows the same turn
  });
  if (gw.isExistingTurn(turn)) return gw.turnResponse(turn, id);
  // A real app: streamText({model, messages, abortSignal: turn.signal}).toUIMessageStream()
  const stream = fakeUIMessageStream(text, { ...model, abortSignal: turn.signal, onAbort: () => console.log(`model aborted: ${turn.runId}`) });
  return gw.publishUIMessageStream(turn, stream, { onError: (err) => console.error("turn:", err) });
}

async function staticFile(pathname) {
  const relative = normalize(pathname === "/" ? "/index.html" : pathname).slice(1);
  const file = join(DIST, relative);
  if (!file.startsWith(DIST) || relative.split(sep).includes("..")) throw new gw.RequestError(404, "not_found", pathname);
  const content = await readFile(file).catch(() => null);
  if (!content) throw new gw.RequestError(404, "not_found", pathname);
  return new Response(content, { headers: { "Content-Type": TYPES[extname(file)] ?? "application/octet-stream" } });
}

const server = createServer(async (req, res) => {
  const url = new URL(req.url, "http://app");
  let response;
  try {
    if (url.pathname === "/api/chat" && req.method === "POST") response = await chat(req, res);
    else if (url.pathname === "/api/access" && req.method === "GET") response = await access(req, res, url);
    else if (req.method === "GET") response = await staticFile(url.pathname);
    else throw new gw.RequestError(405, "method_not_allowed", req.method);
  } catch (err) {
    if (!(err instanceof gw.RequestError)) console.error(err);
    response = err instanceof gw.RequestError ? err.response() : Response.json({ error: "internal" }, { status: 500 });
  }
  await gw.sendResponse(res, response);
});
server.listen(Number(env.PORT ?? 3000), env.HOST ?? "127.0.0.1", () => {
  const { address, port } = server.address();
  console.log(`listening on http://${address}:${port}`);
});
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(0));
