// A second, independent client: the npm `eventsource` package (and gateway-client.js
// running on top of it) against a real gateway started by tests/test_js_client.py.
//
// Env: GATEWAY_URL (base URL), GATEWAY_API_KEY (producer + reader key),
//      GATEWAY_SCOPED_RUN / GATEWAY_SCOPED_TOKEN (a subscriber JWT for that run only).
// The server keeps GATEWAY_MAX_EVENTS events per run, so a reader away for longer
// than that gets a gap.
import { test } from "node:test";
import assert from "node:assert/strict";
import { producerPost } from "./gateway.mjs";
import { createRequire } from "node:module";
import { EventSource } from "eventsource";

const require = createRequire(import.meta.url);
const GatewayClient = require("../../gateway/static/gateway-client.js");

const BASE = process.env.GATEWAY_URL;
const KEY = process.env.GATEWAY_API_KEY;
const MAX_EVENTS = Number(process.env.GATEWAY_MAX_EVENTS);
assert.ok(BASE && KEY && MAX_EVENTS, "GATEWAY_URL, GATEWAY_API_KEY, GATEWAY_MAX_EVENTS");

const AUTH = { Authorization: `Bearer ${KEY}` };
const post = producerPost(BASE, AUTH);
const TIMEOUT = 15_000;

async function claim(body = {}) {
  const reply = await post("/v1/runs", body);
  const headers = { "X-Producer-Token": reply.producer_token };
  return {
    runId: reply.run_id,
    async publish(...texts) {
      const out = [];
      for (const text of texts) {
        const { ids } = await post(`/v1/runs/${reply.run_id}/events`, { event: "token", data: { text } }, headers);
        out.push({ id: ids[0], text });
      }
      return out;
    },
    end(status = "success") {
      return post(`/v1/runs/${reply.run_id}/end`, { status }, headers);
    },
  };
}

// An EventSource (npm eventsource) whose requests carry the API key and, optionally, a
// Last-Event-ID header: what a browser sends on its own reconnects.
function openStream(url, lastEventId) {
  return new EventSource(url, {
    fetch: (input, init) =>
      fetch(input, {
        ...init,
        headers: { ...init.headers, ...AUTH, ...(lastEventId ? { "Last-Event-ID": lastEventId } : {}) },
      }),
  });
}

// Collect `token` frames until `count` arrived or `end` (resolves with {events, end}).
function collect(es, { count = Infinity } = {}) {
  return new Promise((resolve, reject) => {
    const events = [];
    let closed = false; // the parser may still dispatch frames of the chunk after close()
    const timer = setTimeout(() => {
      es.close();
      reject(new Error(`timed out after ${events.length} events`));
    }, TIMEOUT);
    const done = (end) => {
      closed = true;
      clearTimeout(timer);
      es.close();
      resolve({ events, end });
    };
    es.addEventListener("token", (msg) => {
      if (closed) return;
      events.push({ id: msg.lastEventId, text: JSON.parse(msg.data).text });
      if (events.length >= count) done(null);
    });
    es.addEventListener("end", (msg) => closed || done(JSON.parse(msg.data)));
    es.addEventListener("gap", (msg) => closed || done({ gap: JSON.parse(msg.data) }));
    es.onerror = (err) => {
      if (es.readyState === EventSource.CLOSED) {
        clearTimeout(timer);
        reject(new Error(`stream failed: ${err.message || err.code}`));
      }
    };
  });
}

const words = (from, to) => Array.from({ length: to - from }, (_, i) => `w${from + i} `);

test("eventsource: follow, reconnect with Last-Event-ID, exact continuation through end", { timeout: TIMEOUT * 2 }, async () => {
  const run = await claim({ session_id: "js" });
  const url = `${BASE}/v1/runs/${run.runId}/stream`;
  const first = await run.publish(...words(0, 3));

  const part1 = await collect(openStream(url), { count: 2 });
  assert.deepEqual(part1.events, first.slice(0, 2));

  const rest = await run.publish(...words(3, 5));
  await run.end("success");
  const part2 = await collect(openStream(url, part1.events.at(-1).id));
  assert.deepEqual(part2.end, { status: "success" });
  assert.deepEqual([...part1.events, ...part2.events], [...first, ...rest]);
});

test("eventsource: the last_event_id query parameter resumes too; the header wins", { timeout: TIMEOUT * 2 }, async () => {
  const run = await claim();
  const published = await run.publish(...words(0, 4));
  await run.end("success");
  const url = `${BASE}/v1/runs/${run.runId}/stream`;

  const viaQuery = await collect(openStream(`${url}?last_event_id=${published[1].id}`));
  assert.deepEqual(viaQuery.events, published.slice(2));
  assert.deepEqual(viaQuery.end, { status: "success" });

  const headerWins = await collect(openStream(`${url}?last_event_id=${published[0].id}`, published[2].id));
  assert.deepEqual(headerWins.events, published.slice(3));
});

// gateway-client.js on the npm EventSource (the API key goes in via a wrapper class,
// the way a browser page would use a scoped ?access_token= instead).
class KeyedEventSource extends EventSource {
  constructor(url, init) {
    super(url, { ...init, fetch: (input, i) => fetch(input, { ...i, headers: { ...i.headers, ...AUTH } }) });
  }
}

function followToEnd(runId, options) {
  return new Promise((resolve, reject) => {
    const events = [];
    const gaps = [];
    const timer = setTimeout(() => reject(new Error("timed out")), TIMEOUT);
    const follower = GatewayClient.follow(BASE, runId, {
      EventSource: KeyedEventSource,
      ...options,
      onEvent: (ev) => {
        events.push({ id: ev.id, text: ev.data.text });
        if (options.onEvent) options.onEvent(ev, follower);
      },
      onGap: async (gap) => {
        gaps.push(gap);
        return options.onGap ? options.onGap(gap) : undefined;
      },
      onEnd: (end) => {
        clearTimeout(timer);
        resolve({ events, gaps, end, follower });
      },
      onError: (err) => {
        if (err.fatal) {
          clearTimeout(timer);
          resolve({ events, gaps, error: err, follower });
        }
      },
    });
  });
}

test("GatewayClient: follows through end and tracks the last id", { timeout: TIMEOUT * 2 }, async () => {
  const run = await claim({ session_id: "js" });
  const before = await run.publish(...words(0, 2));
  const following = followToEnd(run.runId, { lastEventId: before[0].id });
  const after = await run.publish(...words(2, 4));
  await run.end("success");
  const result = await following;
  assert.deepEqual(result.end, { status: "success" });
  assert.deepEqual(result.events, [before[1], ...after]);
  assert.equal(result.follower.lastEventId, after.at(-1).id);
  assert.equal(result.follower.closed, true);
});

test("GatewayClient: a gap reloads durable state, then rejoins at latest_available_event_id", { timeout: TIMEOUT * 2 }, async () => {
  const run = await claim({ session_id: "js-gap" });
  const seen = await run.publish(...words(0, 2));
  const missed = await run.publish(...words(2, 2 + MAX_EVENTS + 3)); // first ones trimmed
  let durable = null;
  const following = followToEnd(run.runId, {
    lastEventId: seen[1].id,
    onGap: async () => {
      durable = await GatewayClient.reloadDurableState(BASE, run.runId, { bearer: KEY });
      const after = await run.publish(...words(100, 102)); // written during the recovery
      await run.end("success");
      durable.after = after;
    },
  });
  const result = await following;
  assert.equal(result.gaps.length, 1);
  const [gap] = result.gaps;
  assert.equal(gap.code, "stream_replay_gap");
  assert.equal(gap.reason, "trimmed");
  assert.equal(gap.requested_event_id, seen[1].id);
  assert.equal(gap.latest_available_event_id, missed.at(-1).id);
  assert.equal(durable.run.status, "running");
  assert.equal(durable.turn.text, [...seen, ...missed].map((e) => e.text).join(""));
  // Rejoined after latest_available_event_id: exactly what came after, then the END.
  assert.deepEqual(result.events, durable.after);
  assert.deepEqual(result.end, { status: "success" });
});

test("GatewayClient: gap recoveries are bounded", { timeout: TIMEOUT * 2 }, async () => {
  const run = await claim();
  const first = await run.publish("a ");
  await run.publish(...words(0, MAX_EVENTS + 2));
  let recoveries = 0;
  const result = await followToEnd(run.runId, {
    lastEventId: first[0].id,
    maxGapRecoveries: 0,
    onGap: () => { recoveries += 1; },
  });
  assert.equal(result.error.code, "gap_recovery_exhausted");
  assert.equal(recoveries, 0);
  assert.equal(result.follower.closed, true);
  await run.end("success");
});

test("GatewayClient: a scoped token goes in ?access_token= and reads only its run", { timeout: TIMEOUT * 2 }, async () => {
  const runId = process.env.GATEWAY_SCOPED_RUN;
  const token = process.env.GATEWAY_SCOPED_TOKEN;
  assert.ok(runId && token);
  const url = GatewayClient.streamUrl(BASE, runId, "1-0", token);
  assert.equal(new URL(url).searchParams.get("access_token"), token);

  const run = await claim({ run_id: runId });
  const published = await run.publish(...words(0, 3));
  await run.end("success");
  // Plain EventSource (no API key): only the token authorizes it.
  const ok = await followToEnd(runId, { EventSource, accessToken: token });
  assert.deepEqual(ok.events, published);
  assert.deepEqual(ok.end, { status: "success" });

  const other = await claim();
  await other.end("success");
  const refused = await followToEnd(other.runId, { EventSource, accessToken: token });
  assert.equal(refused.error.code, "stream_failed");
  assert.deepEqual(refused.events, []);
});
