// The AI SDK edge end to end in Node: an app route (node:http) that claims a turn and
// publishes `streamText(...).toUIMessageStream()` into it, and the browser transport
// (run here on Node's fetch) following the answer on the gateway, through a relay that
// can be cut.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, describe, test } from "node:test";
import { streamText, convertToModelMessages } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import {
  claimTurn,
  isExistingTurn,
  mintReaderToken,
  publishUIMessageStream,
  readChatRequest,
  RequestError,
  sendResponse,
  textOf,
  turnResponse,
} from "@gateway/ai/server";
import { GatewayChatTransport } from "@gateway/ai/client";
import { api, API_KEY, APP_KID, APP_SECRET, gatewayHas, startGateway, startRelay, until } from "./support.mjs";

const WORDS = 30;
const answer = (prompt) => Array.from({ length: WORDS }, (_, i) => `${prompt}-${i} `).join("");
const models = []; // each model call: {aborted}

/** A model streaming `answer(prompt)` word by word (`delayMs` apart); "[fail]" fails at word 3. */
function model(delayMs) {
  return new MockLanguageModelV3({
    doStream: async ({ prompt, abortSignal }) => {
      const last = prompt.at(-1).content.map((p) => p.text).join("");
      const call = { aborted: false };
      models.push(call);
      abortSignal?.addEventListener("abort", () => (call.aborted = true));
      let i = 0;
      const stream = new ReadableStream({
        start(controller) {
          controller.enqueue({ type: "stream-start", warnings: [] });
          controller.enqueue({ type: "text-start", id: "t" });
        },
        async pull(controller) {
          await new Promise((resolve) => setTimeout(resolve, delayMs));
          if (abortSignal?.aborted) return controller.error(abortSignal.reason);
          if (last.includes("[fail]") && i === 3) return controller.error(new Error("the model failed mid-answer"));
          if (i < WORDS) return controller.enqueue({ type: "text-delta", id: "t", delta: `${last}-${i++} ` });
          controller.enqueue({ type: "text-end", id: "t" });
          controller.enqueue({
            type: "finish",
            finishReason: { unified: "stop", raw: "stop" },
            usage: {
              inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
              outputTokens: { total: WORDS, text: WORDS, reasoning: 0 },
            },
          });
          controller.close();
        },
      });
      return { stream };
    },
  });
}

let gateway;
let relay; // the browser's way to the gateway
let app;
let delayMs = 20;

before(async () => {
  gateway = await startGateway();
  relay = await startRelay(gateway.port);
  // The app's route, as an app writes it (examples/chat/server.mjs is the same).
  app = createServer(async (req, res) => {
    try {
      const { id, messages, message, idempotencyKey } = await readChatRequest(req, { maxBytes: 64 * 1024 });
      const turn = await claimTurn({
        gatewayUrl: gateway.url,
        apiKey: API_KEY,
        sessionId: id,
        inputMessage: { messageId: message.id, role: "user", parts: [{ kind: "text", text: textOf(message) }] },
        idempotencyKey,
      });
      if (isExistingTurn(turn)) return await sendResponse(res, turnResponse(turn, id));
      const result = streamText({
        model: model(delayMs),
        messages: await convertToModelMessages(messages),
        abortSignal: turn.signal,
      });
      await sendResponse(res, publishUIMessageStream(turn, result.toUIMessageStream({ onError: (e) => e.message })));
    } catch (err) {
      const response = err instanceof RequestError ? err.response() : Response.json({ error: "internal", detail: String(err) }, { status: 500 });
      await sendResponse(res, response);
    }
  });
  await new Promise((resolve) => app.listen(0, "127.0.0.1", resolve));
});
after(async () => {
  app?.close();
  await relay?.close();
  await gateway?.stop();
});

const appUrl = () => `http://127.0.0.1:${app.address().port}/api/chat`;
const transport = (extra = {}) =>
  new GatewayChatTransport({
    api: appUrl(),
    access: () => ({ gatewayUrl: relay.url, token: API_KEY }),
    ...extra,
  });
const userMessage = (id, text) => ({ id, role: "user", parts: [{ type: "text", text }] });

/** Reads a chunk stream: the text, the chunks, and how it ended. */
async function collect(stream, onChunk) {
  const chunks = [];
  let text = "";
  try {
    for await (const chunk of stream) {
      chunks.push(chunk);
      if (chunk.type === "text-delta") text += chunk.delta;
      await onChunk?.(chunk, chunks);
    }
    return { chunks, text, error: undefined };
  } catch (error) {
    return { chunks, text, error };
  }
}

const lastTurn = async (chatId) => (await api(gateway, "GET", `/v1/sessions/${chatId}/turns`)).body.turns.at(-1);

describe("the AI SDK edge", { timeout: 60_000 }, () => {
  test("send: the answer streams from the gateway, one turn, success", async () => {
    const chat = transport();
    const stream = await chat.sendMessages({
      chatId: "c-send",
      messages: [userMessage("m1", "hello")],
      trigger: "submit-message",
      messageId: undefined,
      abortSignal: undefined,
    });
    const { chunks, text, error } = await collect(stream);
    assert.equal(error, undefined);
    assert.equal(text, answer("hello"));
    const turn = await lastTurn("c-send");
    assert.equal(turn.state, "success");
    assert.equal(chunks[0].type, "start");
    assert.equal(chunks[0].messageId, turn.run_id, "the live message is the run");
    const history = await chat.loadMessages("c-send");
    assert.deepEqual(
      history.map((m) => [m.role, m.parts.filter((p) => p.type === "text").map((p) => p.text).join("")]),
      [["user", "hello"], ["assistant", answer("hello")]],
    );
    assert.equal(await chat.reconnectToStream({ chatId: "c-send" }), null, "nothing to resume");
  });

  test("a cut mid-answer with the client online: resumed from the last id, exactly once", async () => {
    const chat = transport();
    const stream = await chat.sendMessages({
      chatId: "c-cut",
      messages: [userMessage("m1", "cut")],
      trigger: "submit-message",
      messageId: undefined,
      abortSignal: undefined,
    });
    let cuts = 0;
    const { text, error } = await collect(stream, (chunk, chunks) => {
      if (chunk.type === "text-delta" && (chunks.length === 8 || chunks.length === 20)) {
        relay.cut();
        cuts++;
      }
    });
    assert.equal(cuts, 2);
    assert.equal(error, undefined);
    assert.equal(text, answer("cut"));
  });

  test("resume after a reload: the running turn from its first chunk", async () => {
    const chat = transport();
    const first = await chat.sendMessages({
      chatId: "c-resume",
      messages: [userMessage("m1", "resume")],
      trigger: "submit-message",
      messageId: undefined,
      abortSignal: undefined,
    });
    const reader = first.getReader();
    await reader.read();
    await reader.cancel(); // the page went away; the answer goes on
    const resumed = await transport().reconnectToStream({ chatId: "c-resume" });
    assert.notEqual(resumed, null);
    const { text, error } = await collect(resumed);
    assert.equal(error, undefined);
    assert.equal(text, answer("resume"));
  });

  test("stop: the gateway cancels, the model is aborted, the turn ends cancelled with the partial", async () => {
    const stop = new AbortController();
    const calls = models.length;
    const stream = await transport().sendMessages({
      chatId: "c-stop",
      messages: [userMessage("m1", "stop")],
      trigger: "submit-message",
      messageId: undefined,
      abortSignal: stop.signal,
    });
    const { text, error } = await collect(stream, (chunk) => {
      if (chunk.type === "text-delta" && chunk.delta === "stop-4 ") stop.abort();
    });
    assert.equal(error?.name, "AbortError");
    await until(async () => (await lastTurn("c-stop"))?.state === "cancelled", 10_000, "the cancelled turn");
    assert.equal(models[calls].aborted, true, "the model was not aborted");
    const turn = await lastTurn("c-stop");
    assert.ok(turn.text.startsWith(text), `${turn.text} / ${text}`);
    assert.ok(turn.text.length < answer("stop").length, "the model went on");
  });

  test("a failing model: an error chunk with its reason, the turn ends error", async () => {
    const { chunks, text } = await collect(
      await transport().sendMessages({
        chatId: "c-fail",
        messages: [userMessage("m1", "please [fail]")],
        trigger: "submit-message",
        messageId: undefined,
        abortSignal: undefined,
      }),
    );
    assert.equal(text, answer("please [fail]").split(" ").slice(0, 6).join(" ") + " "); // 3 words
    assert.deepEqual(chunks.filter((c) => c.type === "error"), [{ type: "error", errorText: "the model failed mid-answer" }]);
    const turn = await lastTurn("c-fail");
    assert.equal(turn.state, "error");
  });

  test("a double submit follows one turn", async () => {
    const send = () =>
      transport().sendMessages({
        chatId: "c-double",
        messages: [userMessage("m-double", "twice")],
        trigger: "submit-message",
        messageId: undefined,
        abortSignal: undefined,
      });
    const [a, b] = await Promise.all([send(), send()]);
    const [ra, rb] = await Promise.all([collect(a), collect(b)]);
    assert.equal(ra.text, answer("twice"));
    assert.equal(rb.text, answer("twice"));
    const turns = (await api(gateway, "GET", `/v1/sessions/c-double/turns`)).body.turns;
    assert.equal(turns.length, 1);
  });

  test("a regeneration is a new turn (the same user message, a new request)", async () => {
    const chat = transport();
    const messages = [userMessage("m-regen", "again")];
    const first = await collect(
      await chat.sendMessages({ chatId: "c-regen", messages, trigger: "submit-message", messageId: undefined, abortSignal: undefined }),
    );
    const second = await collect(
      await chat.sendMessages({ chatId: "c-regen", messages, trigger: "regenerate-message", messageId: undefined, abortSignal: undefined }),
    );
    assert.equal(first.text, answer("again"));
    assert.equal(second.text, answer("again"));
    const turns = (await api(gateway, "GET", `/v1/sessions/c-regen/turns`)).body.turns;
    assert.deepEqual(turns.map((t) => t.state), ["success", "success"]);
    assert.notEqual(first.chunks[0].messageId, second.chunks[0].messageId);
  });

  test("the route reads bounded, same-origin JSON only", async () => {
    const post = (body, headers = {}) =>
      fetch(appUrl(), { method: "POST", headers: { "Content-Type": "application/json", ...headers }, body });
    const big = JSON.stringify({ id: "c-big", messages: [userMessage("m", "x".repeat(200_000))] });
    assert.equal((await post(big)).status, 413);
    assert.equal((await post("{}", { "Content-Type": "text/plain" })).status, 415);
    assert.equal((await post("{}", { "Sec-Fetch-Site": "cross-site" })).status, 403);
    assert.equal((await post("{nope")).status, 400);
    assert.equal((await post(JSON.stringify({ id: "c", messages: [] }))).status, 400);
  });

  test("a reader token for the user's own chats reads them and nothing else", { skip: !gatewayHas("--jwt-app-keys") && "the gateway has no app keys" }, async () => {
    const token = await mintReaderToken({ kid: APP_KID, secret: APP_SECRET, sessions: ["c-send"], ttlSeconds: 60 });
    const read = (session) =>
      fetch(`${gateway.url}/v1/sessions/${session}/ui-messages`, { headers: { Authorization: `Bearer ${token}` } });
    assert.equal((await read("c-send")).status, 200);
    assert.equal((await read("c-stop")).status, 403);
    await assert.rejects(mintReaderToken({ kid: APP_KID, secret: APP_SECRET, sessions: ["c"], ttlSeconds: 7200 }), RangeError);
  });
});
