// The session feed with real reconnecting clients: the npm `eventsource` package on its
// own (it reconnects by itself, and must stop after the feed's `end`), and
// gateway-client.js's followSession on top of it (a gap inside a turn is recovered and
// the turn rejoined). Against a real gateway started by tests/test_js_client.py.
//
// Env: GATEWAY_URL, GATEWAY_API_KEY (producer/operator), GATEWAY_SESSION_TOKENS (JSON:
// session id -> subscriber JWT scoped to that session), GATEWAY_MAX_EVENTS (retention).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { EventSource } from "eventsource";

const require = createRequire(import.meta.url);
const GatewayClient = require("../../gateway/static/gateway-client.js");

const BASE = process.env.GATEWAY_URL;
const KEY = process.env.GATEWAY_API_KEY;
const TOKENS = JSON.parse(process.env.GATEWAY_SESSION_TOKENS || "{}");
const MAX_EVENTS = Number(process.env.GATEWAY_MAX_EVENTS);
const AUTH = { Authorization: `Bearer ${KEY}` };
const TIMEOUT = 15_000;

async function call(method, path, body, headers = {}) {
  const response = await fetch(BASE + path, {
    method,
    headers: { "Content-Type": "application/json", ...AUTH, ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const reply = await response.json();
  assert.ok(response.ok, `${method} ${path}: ${response.status} ${JSON.stringify(reply)}`);
  return reply;
}

async function claim(sessionId) {
  const reply = await call("POST", "/v1/runs", {
    session_id: sessionId,
    input_message: { messageId: "m-1", role: "user", parts: [{ kind: "text", text: "hi" }] },
  });
  const headers = { "X-Producer-Token": reply.producer_token };
  return {
    runId: reply.run_id,
    async publish(...texts) {
      const ids = [];
      for (const text of texts) {
        const out = await call("POST", `/v1/runs/${reply.run_id}/events`, { event: "token", data: { text } }, headers);
        ids.push(out.ids[0]);
      }
      return ids;
    },
    end() {
      return call("POST", `/v1/runs/${reply.run_id}/end`, { status: "success" }, headers);
    },
  };
}

function until(predicate, what) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), TIMEOUT);
    const poll = setInterval(() => {
      if (predicate()) {
        clearTimeout(timer);
        clearInterval(poll);
        resolve();
      }
    }, 10);
  });
}

test("an EventSource follows two turns, gets end on retirement and stops reconnecting", async () => {
  const url = GatewayClient.sessionStreamUrl(BASE, "js-feed", null, TOKENS["js-feed"]);
  const es = new EventSource(url);
  const seen = [];
  let opens = 0;
  es.onopen = () => { opens += 1; };
  for (const name of ["turn", "token", "turn_end", "end"]) {
    es.addEventListener(name, (msg) => seen.push([name, msg.lastEventId, JSON.parse(msg.data)]));
  }
  try {
    await until(() => opens === 1, "the feed to open");
    const first = await claim("js-feed");
    const ids = await first.publish("a", "b");
    await first.end();
    const second = await claim("js-feed");
    const ids2 = await second.publish("c");
    await second.end();
    await until(() => seen.length === 7, "two turns");
    assert.deepEqual(seen.map(([name, id]) => [name, id]), [
      ["turn", `${first.runId}/0-0`],
      ["token", `${first.runId}/${ids[0]}`],
      ["token", `${first.runId}/${ids[1]}`],
      ["turn_end", `${first.runId}/end`],
      ["turn", `${second.runId}/0-0`],
      ["token", `${second.runId}/${ids2[0]}`],
      ["turn_end", `${second.runId}/end`],
    ]);
    assert.equal(seen[0][2].input_message.messageId, "m-1");
    await call("DELETE", "/v1/sessions/js-feed");
    await until(() => seen.length === 8, "the end frame");
    assert.deepEqual(seen[7], ["end", "retired", { status: "retired", session_id: "js-feed" }]);
    // The response ended; the EventSource reconnects with Last-Event-ID "retired" by
    // itself, is answered 204 and stops for good (CLOSED), never reconnecting again.
    await until(() => es.readyState === EventSource.CLOSED, "the EventSource to stop");
    assert.equal(opens, 1);
  } finally {
    es.close();
  }
});

test("followSession recovers a gap inside a turn and rejoins it", async () => {
  const producer = await claim("js-gap");
  const ids = await producer.publish(...Array.from({ length: MAX_EVENTS * 2 }, (_, i) => `t${i} `));
  const events = [];
  const gaps = [];
  const ends = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out")), TIMEOUT);
    const feed = GatewayClient.followSession(BASE, "js-gap", {
      EventSource,
      accessToken: TOKENS["js-gap"],
      lastEventId: `${producer.runId}/0-0`, // right after the turn frame: its start is trimmed
      onEvent: (ev) => events.push(ev),
      async onGap(gap) {
        gaps.push(gap);
        const turns = await call("GET", "/v1/sessions/js-gap/turns");
        assert.equal(turns.turns[0].run_id, producer.runId); // the durable text is there
        const more = await producer.publish("after ");
        ids.push(...more);
        await producer.end();
        return true;
      },
      onTurnEnd(end) {
        ends.push(end);
        clearTimeout(timer);
        feed.close();
        resolve();
      },
      onError(err) {
        if (err.fatal) reject(new Error(err.code));
      },
    });
  });
  assert.equal(gaps.length, 1);
  assert.equal(gaps[0].run_id, producer.runId);
  assert.equal(gaps[0].reason, "trimmed");
  assert.equal(gaps[0].latest_available_event_id, ids[MAX_EVENTS * 2 - 1]);
  // rejoined after the newest retained event: exactly the event published after the gap
  assert.deepEqual(events.map((ev) => [ev.id, ev.runId]), [[`${producer.runId}/${ids.at(-1)}`, producer.runId]]);
  assert.deepEqual(ends, [{ run_id: producer.runId, status: "success" }]);
});
