// The producer against a real gateway: one streamed append per turn, its acks, reconnects,
// the fallback behind a buffering proxy, cancel, and the END.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { claimTurn, isExistingTurn } from "../dist/producer.js";
import { api, API_KEY, readRun, startBufferingProxy, startGateway, startRedis, startRelay, until } from "./support.mjs";

// Every case on the memory bridge and, when redis-server is installed, the Redis bridge.
let gateway;
let redis;
const backend = process.env.PRODUCER_BACKEND ?? "memory";
before(async () => {
  if (backend === "redis") {
    redis = await startRedis();
    gateway = await startGateway({ GATEWAY_REDIS_URL: redis.url });
  } else {
    gateway = await startGateway();
  }
});
after(async () => {
  await gateway?.stop();
  await redis?.stop();
});

const claim = (url, sessionId, extra = {}) =>
  claimTurn({
    gatewayUrl: url,
    apiKey: API_KEY,
    sessionId,
    inputMessage: { messageId: `m-${sessionId}`, role: "user", parts: [{ kind: "text", text: "hi" }] },
    ...extra,
  });

describe(`producer (${backend})`, { timeout: 60_000 }, () => {
  test("300 chunks 40 ms away reach a follower within 0.5 s of the first", async () => {
    const relay = await startRelay(gateway.port, 40); // 40 ms each way
    try {
      const turn = await claim(relay.url, "s-latency");
      const reading = readRun(gateway, turn.runId);
      for (let i = 0; i < 300; i++) await turn.send("ui", { type: "text-delta", id: "t", delta: `w${i} ` });
      await turn.end("success");
      const { events, status } = await reading;
      assert.equal(status, "success");
      assert.deepEqual(
        events.map((e) => e.data.delta),
        Array.from({ length: 300 }, (_, i) => `w${i} `),
      );
      const spread = events.at(-1).at - events[0].at;
      assert.ok(spread < 500, `the 300 chunks took ${spread.toFixed(0)} ms after the first`);
      assert.equal(turn.mode, "stream");
    } finally {
      await relay.close();
    }
  });

  test("a dropped connection resumes from the first unacknowledged line, exactly once", async () => {
    const relay = await startRelay(gateway.port, 5);
    try {
      const turn = await claim(relay.url, "s-drop");
      const reading = readRun(gateway, turn.runId);
      for (let i = 0; i < 200; i++) {
        await turn.send("n", i);
        if (i === 60 || i === 130) relay.cut(); // lines in flight are lost with the socket
        if (i % 20 === 0) await new Promise((resolve) => setImmediate(resolve));
      }
      await turn.end("success");
      const { events, status } = await reading;
      assert.equal(status, "success");
      assert.deepEqual(
        events.map((e) => e.data),
        Array.from({ length: 200 }, (_, i) => i),
      );
    } finally {
      await relay.close();
    }
  });

  test("behind a buffering proxy it falls back to numbered batches and delivers exactly", async () => {
    const proxy = await startBufferingProxy(gateway.url);
    try {
      const turn = await claim(proxy.url, "s-buffered", { ackTimeoutMs: 300 });
      const reading = readRun(gateway, turn.runId);
      for (let i = 0; i < 50; i++) await turn.send("n", i);
      await until(() => turn.mode === "batch", 5000, "the fallback");
      for (let i = 50; i < 100; i++) await turn.send("n", i);
      await turn.end("success");
      const { events, status } = await reading;
      assert.equal(status, "success");
      assert.deepEqual(
        events.map((e) => e.data),
        Array.from({ length: 100 }, (_, i) => i),
      );
      assert.ok(proxy.seen.batches > 0, "no batch went through the proxy");
    } finally {
      await proxy.close();
    }
  });

  test("a reader's cancel fires the signal; the turn ends cancelled keeping its events", async () => {
    const turn = await claim(gateway.url, "s-cancel");
    const reading = readRun(gateway, turn.runId);
    await turn.send("n", 0);
    await turn.flush();
    const cancelled = await api(gateway, "POST", `/v1/runs/${turn.runId}/cancel`, {});
    assert.equal(cancelled.status, 202);
    // the next ack (or, while nothing is sent, the lease reply) carries the request
    let sent = 1;
    const aborted = new Promise((resolve) => turn.signal.addEventListener("abort", resolve));
    while (!turn.signal.aborted && sent < 1000) {
      await turn.send("n", sent++);
      await Promise.race([aborted, new Promise((resolve) => setTimeout(resolve, 10))]);
    }
    assert.ok(turn.signal.aborted, "the signal never fired");
    await turn.end("cancelled");
    const { events, status } = await reading;
    assert.equal(status, "cancelled");
    assert.deepEqual(
      events.map((e) => e.data),
      Array.from({ length: sent }, (_, i) => i),
    );
  });

  test("a silent turn still learns of a cancel (lease replies)", async () => {
    const turn = await claim(gateway.url, "s-cancel-idle");
    await turn.send("n", 0);
    await turn.flush();
    await api(gateway, "POST", `/v1/runs/${turn.runId}/cancel`, {});
    await until(() => turn.signal.aborted, 5000, "the abort signal");
    await turn.end("cancelled");
    assert.equal((await api(gateway, "GET", `/v1/runs/${turn.runId}`)).body.status, "cancelled");
  });

  test("an error ends the turn error with its reason", async () => {
    const turn = await claim(gateway.url, "s-error");
    await turn.send("n", 1);
    await turn.fail(new Error("the model broke"));
    const run = (await api(gateway, "GET", `/v1/runs/${turn.runId}`)).body;
    assert.equal(run.status, "error");
    const turns = (await api(gateway, "GET", `/v1/sessions/s-error/turns`)).body.turns;
    assert.equal(turns.at(-1).state, "error");
    const history = (await api(gateway, "GET", `/v1/sessions/s-error/ui-messages`)).body;
    assert.deepEqual(history.at(-1).metadata, { status: "error", error: { message: "the model broke" } });
  });

  test("run(): an exception ends error with its message; a cancel ends cancelled", async () => {
    const failing = await claim(gateway.url, "s-run-error");
    const failed = await failing.run(async (turn) => {
      await turn.send("n", 1);
      throw new Error("tool crashed");
    });
    assert.equal(failed, "error");
    const history = (await api(gateway, "GET", `/v1/sessions/s-run-error/ui-messages`)).body;
    assert.deepEqual(history.at(-1).metadata, { status: "error", error: { message: "tool crashed" } });

    const stopping = await claim(gateway.url, "s-run-cancel");
    const ended = await stopping.run(async (turn) => {
      await turn.send("n", 0);
      await turn.flush();
      await api(gateway, "POST", `/v1/runs/${turn.runId}/cancel`, {});
      // a model handed turn.signal throws an AbortError when it fires
      await new Promise((resolve, reject) => turn.signal.addEventListener("abort", () => reject(turn.signal.reason)));
    });
    assert.equal(ended, "cancelled");
    const { events, status } = await readRun(gateway, stopping.runId);
    assert.equal(status, "cancelled");
    assert.deepEqual(events.map((e) => e.data), [0]);
  });

  test("a second claim with the same idempotency key gets the running turn", async () => {
    const first = await claim(gateway.url, "s-idem", { idempotencyKey: "msg-1" });
    assert.ok(!isExistingTurn(first));
    const second = await claim(gateway.url, "s-idem", { idempotencyKey: "msg-1" });
    assert.deepEqual(second, { existing: first.runId });
    await first.end("success");
    const again = await claim(gateway.url, "s-idem", { idempotencyKey: "msg-1" });
    assert.deepEqual(again, { existing: first.runId }, "within the ended TTL too");
  });
});

describe(`a silent turn (${backend})`, { timeout: 30_000 }, () => {
  test("ends its streamed body before the gateway's idle limit and goes on after", async () => {
    const turn = await claim(gateway.url, "s-silent", { leaseSeconds: 2 });
    const reading = readRun(gateway, turn.runId);
    await turn.send("n", 0);
    await turn.flush();
    await new Promise((resolve) => setTimeout(resolve, 3000)); // silent for longer than the lease
    await turn.send("n", 1);
    await turn.end("success");
    const { events, status } = await reading;
    assert.equal(status, "success");
    assert.deepEqual(events.map((e) => e.data), [0, 1]);
  });
});
