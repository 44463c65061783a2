// The AI SDK (npm `ai`) resuming chats from the gateway's ui-stream, with no glue code
// beyond `prepareReconnectToStreamRequest` (run by tests/test_js_client.py).
//
// A headless chat: `AbstractChat` with a small observable `ChatState` (what useChat keeps
// in React state). The connection is cut mid-turn by a loopback TCP proxy in front of the
// gateway; the app then calls `resumeStream()`, as `useChat({resume: true})` does on mount.
//
// Env: GATEWAY_URL, GATEWAY_API_KEY.
import { test } from "node:test";
import assert from "node:assert/strict";
import { producerPost } from "./gateway.mjs";
import { AbstractChat, DefaultChatTransport } from "ai";
import { tcpProxy } from "./proxy.mjs";

const BASE = process.env.GATEWAY_URL;
const KEY = process.env.GATEWAY_API_KEY;
assert.ok(BASE && KEY, "GATEWAY_URL, GATEWAY_API_KEY");
const AUTH = { Authorization: `Bearer ${KEY}` };
const post = producerPost(BASE, AUTH);
const TIMEOUT = 15_000;

// The POST side of an AI SDK app, as a gateway producer: each UI message chunk is an
// event named `ui`.
async function producer(sessionId) {
  const claim = await post("/v1/runs", { session_id: sessionId });
  const headers = { "X-Producer-Token": claim.producer_token };
  return {
    runId: claim.run_id,
    chunks: (...chunks) =>
      post(`/v1/runs/${claim.run_id}/events`, { events: chunks.map((data) => ({ event: "ui", data })) }, headers),
    end: (status = "success", error) => post(`/v1/runs/${claim.run_id}/end`, { status, ...(error ? { error } : {}) }, headers),
  };
}

const opening = (messageId) => [
  { type: "start", messageId },
  { type: "start-step" },
  { type: "text-start", id: "t1" },
];
const deltas = (words) => words.map((delta) => ({ type: "text-delta", id: "t1", delta }));
const closing = [{ type: "text-end", id: "t1" }, { type: "finish-step" }, { type: "finish" }];

// What useChat keeps in React state, observable so a test can await a condition.
class ObservableState {
  constructor() {
    this._status = "ready";
    this.error = undefined;
    this.messages = [];
    this.waiters = new Set();
  }
  get status() { return this._status; }
  set status(value) { this._status = value; this.changed(); }
  pushMessage(message) { this.messages = [...this.messages, message]; this.changed(); }
  popMessage() { this.messages = this.messages.slice(0, -1); this.changed(); }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
    this.changed();
  }
  snapshot(thing) { return structuredClone(thing); }
  changed() { for (const waiter of [...this.waiters]) waiter(); }
  until(predicate, what) {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (!predicate()) return;
        clearTimeout(timer);
        this.waiters.delete(check);
        resolve();
      };
      const timer = setTimeout(() => {
        this.waiters.delete(check);
        reject(new Error(`timed out waiting for ${what}`));
      }, TIMEOUT);
      this.waiters.add(check);
      check();
    });
  }
}

class HeadlessChat extends AbstractChat {
  constructor({ id, base }) {
    const state = new ObservableState();
    super({
      id,
      state,
      transport: new DefaultChatTransport({
        api: `${base}/api/chat`, // the app's own POST route (not used here)
        prepareReconnectToStreamRequest: ({ id: chatId }) => ({
          api: `${base}/v1/sessions/${encodeURIComponent(chatId)}/ui-stream`,
          headers: AUTH,
        }),
      }),
    });
    this.observed = state;
  }
  text() {
    const last = this.messages.at(-1);
    if (!last) return "";
    return last.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
  }
}

test("ai sdk: a turn cut mid-stream resumes with resumeStream(): exact message, status ready", { timeout: TIMEOUT * 2 }, async () => {
  const sessionId = `ai-cut-${Date.now()}`;
  const proxy = await tcpProxy(BASE);
  try {
    const run = await producer(sessionId);
    const words = ["The ", "answer ", "is ", "forty", "-two", "."];
    await run.chunks(...opening("m1"), ...deltas(words.slice(0, 2)));

    const chat = new HeadlessChat({ id: sessionId, base: proxy.base });
    const first = chat.resumeStream();
    await chat.observed.until(() => chat.text() === "The answer ", "the first two deltas");
    await run.chunks(...deltas(words.slice(2, 3)));
    await chat.observed.until(() => chat.text() === "The answer is ", "the live delta");
    proxy.cut(); // the network drops mid-turn
    await first;
    // An interrupted stream, never a finished answer.
    assert.equal(chat.status, "error");
    assert.equal(chat.text(), "The answer is ");

    // While the client is away the turn goes on.
    await run.chunks(...deltas(words.slice(3, 5)));
    const second = chat.resumeStream(); // what the app does when it is back
    await chat.observed.until(() => chat.text() === "The answer is forty-two", "the replay");
    await run.chunks(...deltas(words.slice(5)), ...closing);
    await run.end("success");
    await second;

    assert.equal(chat.status, "ready");
    assert.equal(chat.error, undefined);
    assert.equal(chat.messages.length, 1, JSON.stringify(chat.messages));
    const [message] = chat.messages;
    assert.equal(message.id, "m1");
    assert.equal(message.role, "assistant");
    assert.deepEqual(
      JSON.parse(JSON.stringify(message.parts)),
      [{ type: "step-start" }, { type: "text", text: words.join(""), state: "done" }],
    );
  } finally {
    await proxy.close();
  }
});

test("ai sdk: nothing to resume is ready, with no error and no message", { timeout: TIMEOUT }, async () => {
  const sessionId = `ai-none-${Date.now()}`;
  const ended = await producer(sessionId); // a finished turn is nothing to resume
  await ended.chunks(...opening("m0"), ...deltas(["done"]), ...closing);
  await ended.end("success");
  for (const id of [sessionId, `ai-never-${Date.now()}`]) {
    const chat = new HeadlessChat({ id, base: BASE });
    await chat.resumeStream();
    assert.equal(chat.status, "ready");
    assert.equal(chat.error, undefined);
    assert.deepEqual(chat.messages, []);
  }
});

test("ai sdk: a turn that ends with END error leaves the chat in status error", { timeout: TIMEOUT }, async () => {
  const sessionId = `ai-error-${Date.now()}`;
  const run = await producer(sessionId);
  await run.chunks(...opening("m2"), ...deltas(["partial "]));
  const chat = new HeadlessChat({ id: sessionId, base: BASE });
  const resumed = chat.resumeStream();
  await chat.observed.until(() => chat.text() === "partial ", "the partial text");
  await run.end("error", { message: "model overloaded" });
  await resumed;
  assert.equal(chat.status, "error");
  assert.match(chat.error.message, /error/);
  assert.match(chat.error.message, /model overloaded/);
});
