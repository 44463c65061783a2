// Auto-reconnecting Node clients used as an app would, each with its own reconnect
// mechanism: npm `eventsource` 4 and 3 (WHATWG EventSource) and `@microsoft/fetch-event-source`
// (run by tests/test_js_client.py).
//
// For each: exact resume after a cut (loopback TCP proxy) while the run goes on; after
// `end` and after `gap` it sees the event once and makes at most one request in 8 s;
// nothing past a gap reaches it; it never hands the app an empty event (the `retry:` hint
// and the heartbeats while it waits are no events).
//
// Env: GATEWAY_URL, GATEWAY_API_KEY, GATEWAY_MAX_EVENTS (the run retention).
import { test } from "node:test";
import assert from "node:assert/strict";
import { producerPost } from "./gateway.mjs";
import { EventSource } from "eventsource";
import { EventSource as EventSource3 } from "eventsource3";
import { fetchEventSource } from "@microsoft/fetch-event-source";
import { tcpProxy } from "./proxy.mjs";

const BASE = process.env.GATEWAY_URL;
const KEY = process.env.GATEWAY_API_KEY;
const MAX_EVENTS = Number(process.env.GATEWAY_MAX_EVENTS);
assert.ok(BASE && KEY && MAX_EVENTS, "GATEWAY_URL, GATEWAY_API_KEY, GATEWAY_MAX_EVENTS");
const AUTH = { Authorization: `Bearer ${KEY}` };
const post = producerPost(BASE, AUTH);
const QUIET_MS = 8_000;
const TIMEOUT = 30_000;

// fetch-event-source is written for browsers: it uses window timers and listens for
// `visibilitychange` on document. In Node an app provides both.
globalThis.window ??= globalThis;
globalThis.document ??= { hidden: false, addEventListener() {}, removeEventListener() {} };

async function claim() {
  const reply = await post("/v1/runs", {});
  const headers = { "X-Producer-Token": reply.producer_token };
  return {
    runId: reply.run_id,
    async publish(...values) {
      const ids = [];
      for (const i of values) ids.push(...(await post(`/v1/runs/${reply.run_id}/events`, { event: "token", data: { i } }, headers)).ids);
      return ids;
    },
    end: () => post(`/v1/runs/${reply.run_id}/end`, { status: "success" }, headers),
  };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// What a client handed the app, and every request it made (through its fetch option).
class Seen {
  constructor() {
    this.events = [];
    this.requests = [];
    this.terminalAt = null;
    this.waiters = new Set();
  }
  fetch = (input, init) => {
    this.requests.push({ at: Date.now(), lastEventId: new Headers(init?.headers).get("last-event-id") });
    return fetch(input, { ...init, headers: { ...Object.fromEntries(new Headers(init?.headers)), ...AUTH } });
  };
  add(event, id, data) {
    this.events.push({ event, id, data });
    if ((event === "end" || event === "gap") && this.terminalAt === null) this.terminalAt = Date.now();
    for (const waiter of [...this.waiters]) waiter();
  }
  until(predicate, what) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}: ${JSON.stringify(this.events)}`)), TIMEOUT);
      const check = () => {
        if (!predicate()) return;
        clearTimeout(timer);
        this.waiters.delete(check);
        resolve();
      };
      this.waiters.add(check);
      check();
    });
  }
  data() {
    return this.events.filter((e) => e.event === "token").map((e) => JSON.parse(e.data).i);
  }
  requestsAfterTerminal() {
    return this.requests.filter((r) => r.at > this.terminalAt);
  }
}

// The app only listens: EventSource reconnects by itself (Last-Event-ID) after any end
// of the response, and stops for good on HTTP 204.
function listenOnly(EventSourceImpl) {
  return (url, seen) => {
    const es = new EventSourceImpl(url, { fetch: seen.fetch });
    for (const name of ["token", "end", "gap"]) {
      es.addEventListener(name, (m) => seen.add(name, m.lastEventId, m.data));
    }
    es.onmessage = (m) => seen.add("message", m.lastEventId, m.data); // unnamed: none expected
    return () => es.close();
  };
}

// The clients, as an app uses each; each returns a stop() function.
const CLIENTS = {
  "eventsource@4": listenOnly(EventSource),
  "eventsource@3": listenOnly(EventSource3),
  // The README's reconnecting setup: onclose throws to retry (with last-event-id), and
  // the app's onopen treats 204 as "done" (a fatal error, rethrown by onerror).
  "fetch-event-source"(url, seen) {
    class Done extends Error {}
    class Retry extends Error {}
    const controller = new AbortController();
    fetchEventSource(url, {
      fetch: seen.fetch,
      signal: controller.signal,
      openWhenHidden: true,
      async onopen(response) {
        if (response.status === 204) throw new Done();
        if (!response.ok) throw new Done();
      },
      onmessage: (m) => seen.add(m.event || "message", m.id, m.data),
      onclose() { throw new Retry(); },
      onerror(err) {
        if (err instanceof Done) throw err;
        return undefined; // the server's retry: hint
      },
    }).catch(() => {});
    return () => controller.abort();
  },
};

for (const [name, open] of Object.entries(CLIENTS)) {
  test(`${name}: exact resume after a cut; one request at most after end`, { timeout: TIMEOUT * 2 }, async () => {
    const proxy = await tcpProxy(BASE);
    const seen = new Seen();
    let stop = () => {};
    try {
      const run = await claim();
      await run.publish(0, 1);
      stop = open(`${proxy.base}/v1/runs/${run.runId}/stream`, seen);
      await seen.until(() => seen.data().length === 2, "two events");
      await sleep(700); // idle: heartbeats (every 0.3 s) reach the client
      proxy.cut();
      await run.publish(2, 3);
      await run.end();
      await seen.until(() => seen.terminalAt !== null, "end");
      await sleep(QUIET_MS);
      assert.deepEqual(seen.data(), [0, 1, 2, 3]);
      assert.equal(seen.events.filter((e) => e.event === "end").length, 1);
      assert.equal(seen.events.at(-1).event, "end");
      assert.ok(seen.events.every((e) => e.data), `an empty event: ${JSON.stringify(seen.events)}`);
      const resumed = seen.requests.filter((r) => r.lastEventId && r.lastEventId !== "end");
      assert.ok(resumed.length >= 1, "the client resumed with its last id");
      assert.ok(seen.requestsAfterTerminal().length <= 1, JSON.stringify(seen.requestsAfterTerminal()));
    } finally {
      stop();
      await proxy.close();
    }
  });

  test(`${name}: one request at most after a gap, never an event past it`, { timeout: TIMEOUT * 2 }, async () => {
    const seen = new Seen();
    let stop = () => {};
    try {
      const run = await claim();
      const ids = await run.publish(...Array.from({ length: MAX_EVENTS + 3 }, (_, i) => i));
      stop = open(`${BASE}/v1/runs/${run.runId}/stream?last_event_id=${ids[0]}`, seen);
      await seen.until(() => seen.terminalAt !== null, "gap");
      await run.publish(99); // the run goes on
      await sleep(QUIET_MS);
      assert.equal(seen.events.filter((e) => e.event === "gap").length, 1, JSON.stringify(seen.events));
      assert.deepEqual(seen.data(), []);
      assert.ok(seen.requestsAfterTerminal().length <= 1, JSON.stringify(seen.requestsAfterTerminal()));
      await run.end();
    } finally {
      stop();
    }
  });
}
