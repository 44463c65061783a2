// Producer cost on the Node side: CPU per chunk and chunks/s per Node core, for the
// package's streamed append (one request per turn) beside the hand-written recipe (one
// awaited, numbered POST per chunk), against one local gateway (memory bridge).
//
//   node bench/producer.mjs [chunks=3000] [rounds=3]      (after npm run build)
//
// CPU is this process's (process.cpuUsage: user + system), so the gateway's own work is
// not counted; wall time includes waiting for the gateway.
import { claimTurn } from "../dist/producer.js";
import { API_KEY, startGateway } from "../test/support.mjs";

const CHUNKS = Number(process.argv[2] ?? 3000);
const ROUNDS = Number(process.argv[3] ?? 3);
const chunk = (i) => ({ type: "text-delta", id: "text", delta: `word${i} ` });

async function streamed(gateway, session) {
  const turn = await claimTurn({ gatewayUrl: gateway.url, apiKey: API_KEY, sessionId: session });
  for (let i = 0; i < CHUNKS; i++) await turn.send("ui", chunk(i));
  await turn.end("success");
}

async function perPost(gateway, session) {
  const headers = { "Content-Type": "application/json", Authorization: `Bearer ${API_KEY}` };
  const post = async (path, body, extra = {}) => {
    const response = await fetch(gateway.url + path, { method: "POST", headers: { ...headers, ...extra }, body: JSON.stringify(body) });
    const reply = await response.json();
    if (!response.ok) throw new Error(JSON.stringify(reply));
    return reply;
  };
  const claim = await post("/v1/runs", { session_id: session });
  const token = { "X-Producer-Token": claim.producer_token };
  for (let i = 0; i < CHUNKS; i++) {
    await post(`/v1/runs/${claim.run_id}/events`, { event: "ui", data: chunk(i) }, { ...token, "X-Producer-Seq": String(i + 1) });
  }
  await post(`/v1/runs/${claim.run_id}/end`, { status: "success" }, token);
}

async function measure(name, fn, gateway) {
  const results = [];
  for (let round = 0; round < ROUNDS; round++) {
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    await fn(gateway, `bench-${name}-${round}`);
    const wall = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    const cpuSeconds = (cpu.user + cpu.system) / 1e6;
    results.push({ cpuUs: (cpuSeconds * 1e6) / CHUNKS, perCore: CHUNKS / cpuSeconds, perSecond: CHUNKS / wall });
  }
  results.sort((a, b) => a.cpuUs - b.cpuUs);
  const mid = results[Math.floor(results.length / 2)];
  console.log(
    `${name.padEnd(9)} ${mid.cpuUs.toFixed(1).padStart(7)} µs CPU/chunk  ${Math.round(mid.perCore).toString().padStart(7)} chunks/s per Node core  ${Math.round(mid.perSecond).toString().padStart(6)} chunks/s wall`,
  );
}

const gateway = await startGateway({ GATEWAY_MAX_EVENTS_PER_RUN: String(CHUNKS + 10) });
try {
  console.log(`node ${process.version}, ${CHUNKS} chunks a turn, median of ${ROUNDS} rounds`);
  await streamed(gateway, "bench-warmup-1"); // JIT and connections warm for both
  await perPost(gateway, "bench-warmup-2");
  await measure("streamed", streamed, gateway);
  await measure("per-POST", perPost, gateway);
} finally {
  await gateway.stop();
}
