// A `resumable-stream` lookalike on the gateway: the same context and methods, so an app
// switches by changing its import. Each stream id is one gateway run (the id is the run
// id, after `keyPrefix`); each string the stream yields is one event named `text`.
//
// Differences that matter: nothing but the gateway is needed (no Redis client in the app),
// every reader reads the same retained log, and a stream whose maker throws ends `error`.
import { claimTurn, GatewayError, isExistingTurn, type Turn } from "./producer.js";
import { followRun } from "./follow.js";

export interface CreateResumableStreamContextOptions {
  /** Keeps a serverless function alive until the stream is written (Next.js `after`); null elsewhere. */
  waitUntil: ((promise: Promise<unknown>) => void) | null;
  /** Prepended to each stream id to make its run id (default `rs-`). */
  keyPrefix?: string;
  /** The gateway (default: the GATEWAY_URL environment variable, then http://127.0.0.1:8000). */
  gatewayUrl?: string;
  /** A key for the producer and reader routes (default: GATEWAY_API_KEY, if set). */
  apiKey?: string;
  /** A session to file each stream under (a chat id), if any. */
  sessionOf?: (streamId: string) => string | undefined;
  fetch?: typeof fetch;
}

export interface ResumableStreamContext {
  resumableStream: (
    streamId: string,
    makeStream: () => ReadableStream<string>,
    skipCharacters?: number,
  ) => Promise<ReadableStream<string> | null>;
  resumeExistingStream: (streamId: string, skipCharacters?: number) => Promise<ReadableStream<string> | null | undefined>;
  createNewResumableStream: (
    streamId: string,
    makeStream: () => ReadableStream<string>,
    skipCharacters?: number,
  ) => Promise<ReadableStream<string> | null>;
  hasExistingStream: (streamId: string) => Promise<null | true | "DONE">;
}

const env = (name: string): string | undefined =>
  (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env?.[name];

export function createResumableStreamContext(options: CreateResumableStreamContextOptions): ResumableStreamContext {
  const gatewayUrl = (options.gatewayUrl ?? env("GATEWAY_URL") ?? "http://127.0.0.1:8000").replace(/\/+$/, "");
  const apiKey = options.apiKey ?? env("GATEWAY_API_KEY");
  const prefix = options.keyPrefix ?? "rs-";
  const doFetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  const auth: Record<string, string> = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
  const runOf = (streamId: string): string => `${prefix}${streamId}`;

  async function status(streamId: string): Promise<string | null> {
    const response = await doFetch(`${gatewayUrl}/v1/runs/${encodeURIComponent(runOf(streamId))}`, { headers: auth });
    if (response.status === 404) return null;
    if (!response.ok) throw new GatewayError(response.status, "http_error", await response.text());
    return String(((await response.json()) as { status?: unknown }).status);
  }

  function read(streamId: string, skipCharacters = 0): ReadableStream<string> {
    const stop = new AbortController();
    let skip = skipCharacters;
    return new ReadableStream<string>({
      start(controller) {
        void followRun(
          {
            url: `${gatewayUrl}/v1/runs/${encodeURIComponent(runOf(streamId))}/stream`,
            headers: () => auth,
            signal: stop.signal,
            fetch: doFetch,
          },
          {
            frame: (frame) => {
              if (frame.event !== "text") return;
              let text = JSON.parse(frame.data) as string;
              if (skip > 0) {
                const cut = Math.min(skip, text.length);
                text = text.slice(cut);
                skip -= cut;
              }
              if (text) controller.enqueue(text);
            },
            end: () => controller.close(),
            gap: () => controller.error(new Error(`stream ${streamId} is no longer retained`)),
            fail: (err) => controller.error(err),
          },
        );
      },
      cancel() {
        stop.abort();
      },
    });
  }

  async function write(turn: Turn, makeStream: () => ReadableStream<string>): Promise<void> {
    try {
      const reader = makeStream().getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        await turn.send("text", value);
      }
      await turn.end("success");
    } catch (err) {
      await turn.fail(err).catch(() => undefined);
    }
  }

  async function create(
    streamId: string,
    makeStream: () => ReadableStream<string>,
    skipCharacters?: number,
  ): Promise<ReadableStream<string> | null> {
    const sessionId = options.sessionOf?.(streamId);
    let claim;
    try {
      claim = await claimTurn({
        gatewayUrl,
        apiKey,
        runId: runOf(streamId),
        sessionId: sessionId as string,
        fetch: doFetch,
      });
    } catch (err) {
      // another instance started it first: follow that one
      if (err instanceof GatewayError && err.code === "run_owned") return read(streamId, skipCharacters);
      if (err instanceof GatewayError && err.code === "run_ended") return null;
      throw err;
    }
    if (isExistingTurn(claim)) return read(streamId, skipCharacters);
    const writing = write(claim, makeStream);
    options.waitUntil?.(writing);
    return read(streamId, skipCharacters);
  }

  return {
    createNewResumableStream: create,
    async resumableStream(streamId, makeStream, skipCharacters) {
      const state = await status(streamId);
      if (state === null) return create(streamId, makeStream, skipCharacters);
      return state === "running" ? read(streamId, skipCharacters) : null;
    },
    async resumeExistingStream(streamId, skipCharacters) {
      const state = await status(streamId);
      if (state === null) return undefined;
      return state === "running" ? read(streamId, skipCharacters) : null;
    },
    async hasExistingStream(streamId) {
      const state = await status(streamId);
      if (state === null) return null;
      return state === "running" ? true : "DONE";
    },
  };
}
