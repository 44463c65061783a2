// A producer process killed mid-turn: its streamed append's connection dies with it, and
// readers get `producer_lost` within seconds (the gateway's grace), not after the lease.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { after, before, test } from "node:test";
import { gatewayHas, readRun, startGateway } from "./support.mjs";

const PRODUCER = `
import { claimTurn } from "@gateway/ai/producer";
const turn = await claimTurn({ gatewayUrl: process.env.URL, apiKey: process.env.KEY, sessionId: "s-killed", leaseSeconds: 60 });
console.log(turn.runId);
for (let i = 0; ; i++) {
  await turn.send("n", i);
  await new Promise((resolve) => setTimeout(resolve, 20));
}
`;

let gateway;
const skip = !gatewayHas("--producer-lost-grace-seconds") && "the gateway has no producer-lost grace";
before(async () => {
  if (!skip) gateway = await startGateway({ GATEWAY_PRODUCER_LOST_GRACE_SECONDS: "2" });
});
after(async () => {
  await gateway?.stop();
});

test("a killed producer is lost within seconds", { skip, timeout: 30_000 }, async () => {
  const { API_KEY } = await import("./support.mjs");
  const child = spawn(process.execPath, ["--input-type=module", "-e", PRODUCER], {
    cwd: new URL("..", import.meta.url),
    env: { ...process.env, URL: gateway.url, KEY: API_KEY },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const runId = await new Promise((resolve) => child.stdout.once("data", (d) => resolve(String(d).trim())));
  let killedAt;
  const reading = readRun(gateway, runId, {
    onEvent: (event) => {
      if (event.data === 10 && killedAt === undefined) {
        child.kill("SIGKILL");
        killedAt = performance.now();
      }
    },
  });
  const { events, status } = await reading;
  const waited = performance.now() - killedAt;
  assert.equal(status, "producer_lost");
  assert.ok(waited < 10_000, `producer_lost came ${waited.toFixed(0)} ms after the kill (lease 60 s)`);
  assert.deepEqual(
    events.map((e) => e.data),
    Array.from({ length: events.length }, (_, i) => i),
  );
});
