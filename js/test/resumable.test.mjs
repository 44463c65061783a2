// The resumable-stream adapter, used exactly as resumable-stream's README shows its
// Next.js route (only the import differs; `after` stands in for next/server's).
import assert from "node:assert/strict";
import { after as afterAll, before, describe, test } from "node:test";
import { API_KEY, startGateway } from "./support.mjs";

let gateway;
let GET;
let streamContext;
const pending = [];
const after = (promise) => pending.push(promise); // next/server's after(): run on after the response

function makeTestStream() {
  let i = 0;
  return new ReadableStream({
    async pull(controller) {
      await new Promise((resolve) => setTimeout(resolve, 30));
      if (i === 10) return controller.close();
      controller.enqueue(`data: chunk ${i++}\n\n`);
    },
  });
}
const WHOLE = Array.from({ length: 10 }, (_, i) => `data: chunk ${i}\n\n`).join("");

before(async () => {
  gateway = await startGateway();
  process.env.GATEWAY_URL = gateway.url; // as resumable-stream reads REDIS_URL
  process.env.GATEWAY_API_KEY = API_KEY;

  // ---- as in the README, with the import changed ----
  const { createResumableStreamContext } = await import("@gateway/ai/resumable-stream");
  streamContext = createResumableStreamContext({
    waitUntil: after,
  });
  GET = async function GET(req, { params }) {
    const { streamId } = await params;
    const resumeAt = req.nextUrl.searchParams.get("resumeAt");
    return new Response(
      await streamContext.resumableStream(streamId, makeTestStream, resumeAt ? parseInt(resumeAt) : undefined),
      {
        headers: {
          "Content-Type": "text/event-stream",
        },
      },
    );
  };
  // ----
});
afterAll(async () => {
  await Promise.allSettled(pending);
  await gateway?.stop();
});

// What the framework does with the route's Response: write each chunk of its body (the
// adapter, like resumable-stream, yields strings, which Next.js writes as they are).
async function bodyText(response) {
  if (response.body === null) return "";
  let text = "";
  const decoder = new TextDecoder();
  for await (const chunk of response.body) text += typeof chunk === "string" ? chunk : decoder.decode(chunk);
  return text;
}

const request = (streamId, resumeAt) => {
  const url = new URL(`http://app/api/stream/${streamId}`);
  if (resumeAt !== undefined) url.searchParams.set("resumeAt", String(resumeAt));
  const req = new Request(url);
  req.nextUrl = url; // what NextRequest adds
  return GET(req, { params: Promise.resolve({ streamId }) });
};

describe("resumable-stream adapter", { timeout: 30_000 }, () => {
  test("the first GET streams it all; a second one resumes; after the end: none", async () => {
    assert.equal(await streamContext.hasExistingStream("s1"), null);
    const first = await request("s1");
    const firstText = bodyText(first);
    const resumed = await request("s1", 12); // another client joins mid-way, 12 chars in
    assert.equal(await streamContext.hasExistingStream("s1"), true);
    assert.equal(await firstText, WHOLE);
    assert.equal(await bodyText(resumed), WHOLE.slice(12));
    await Promise.all(pending);
    assert.equal(await streamContext.hasExistingStream("s1"), "DONE");
    assert.equal(await bodyText(await request("s1")), ""); // done: resumableStream gives null
    assert.equal(await streamContext.resumeExistingStream("s1"), null);
    assert.equal(await streamContext.resumeExistingStream("never"), undefined);
  });

  test("a maker that throws ends the stream's run error", async () => {
    const stream = await streamContext.createNewResumableStream("s2", () => {
      let pulls = 0;
      return new ReadableStream({
        pull(controller) {
          if (pulls++ === 0) controller.enqueue("data: one\n\n");
          else controller.error(new Error("model down"));
        },
      });
    });
    assert.equal(await bodyText({ body: stream }), "data: one\n\n");
    await Promise.all(pending);
    const run = await (await fetch(`${gateway.url}/v1/runs/rs-s2`, { headers: { Authorization: `Bearer ${API_KEY}` } })).json();
    assert.equal(run.status, "error");
  });
});
