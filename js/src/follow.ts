// Following one run's SSE stream to its end, through any number of dropped connections:
// each reconnect carries the last event id, so nothing is lost or repeated. Shared by the
// browser transport (UI message chunks) and the resumable-stream adapter (strings).
import { readSSE, type SSEFrame } from "./sse.js";

export interface FollowOptions {
  /** The run's stream URL: `${gateway}/v1/runs/${runId}/stream`. */
  url: string;
  /** Headers of each attempt (a bearer token); `refresh` true after a 401/403. */
  headers: (refresh: boolean) => Promise<Record<string, string>> | Record<string, string>;
  signal?: AbortSignal | undefined;
  /** Give up after this long without a working connection (ms, default 30000). */
  deadlineMs?: number | undefined;
  /** First pause between attempts (ms, default 250); doubles up to `maxBackoffMs` (2000). */
  backoffMs?: number | undefined;
  maxBackoffMs?: number | undefined;
  lastEventId?: string | undefined;
  fetch?: typeof fetch;
}

export interface FollowHandlers {
  /** A data event (not `end`/`gap`). */
  frame: (frame: SSEFrame) => void;
  /** The run's END (`status`), or `undefined` for a 204 (nothing more to send). */
  end: (status: string | undefined) => void;
  gap: (detail: Record<string, unknown>) => void;
  fail: (error: Error) => void;
}

const abortable = (ms: number, signal: AbortSignal | undefined): Promise<void> =>
  new Promise((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      globalThis.removeEventListener?.("online", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done);
    // A browser that is back online retries at once rather than at the end of the pause.
    globalThis.addEventListener?.("online", done);
  });

/** Follows the run until its END, a gap, an abort or the deadline; never throws. */
export async function followRun(options: FollowOptions, on: FollowHandlers): Promise<void> {
  const doFetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  const deadlineMs = options.deadlineMs ?? 30_000;
  const maxBackoff = options.maxBackoffMs ?? 2000;
  let backoff = options.backoffMs ?? 250;
  let lastId = options.lastEventId;
  let failingSince: number | undefined;
  let refresh = false;
  let lastProblem = "";
  for (;;) {
    if (options.signal?.aborted) return;
    try {
      const headers: Record<string, string> = { Accept: "text/event-stream", ...(await options.headers(refresh)) };
      if (lastId !== undefined) headers["Last-Event-ID"] = lastId;
      const init: RequestInit = { headers, cache: "no-store" };
      if (options.signal) init.signal = options.signal;
      const response = await doFetch(options.url, init);
      if (response.status === 204) {
        on.end(undefined);
        return;
      }
      if ((response.status === 401 || response.status === 403) && !refresh) {
        refresh = true; // a token that expired: ask for a fresh one, once
        continue;
      }
      if (!response.ok || !response.body) {
        const text = await response.text().catch(() => "");
        lastProblem = `${response.status} ${text.slice(0, 200)}`;
        if (response.status < 500 && response.status !== 429 && response.status !== 408) {
          on.fail(new Error(`the answer stream was refused: ${lastProblem}`));
          return;
        }
      } else {
        refresh = false;
        for await (const frame of readSSE(response.body)) {
          failingSince = undefined;
          backoff = options.backoffMs ?? 250;
          if (frame.event === "end") {
            on.end(parseStatus(frame.data));
            return;
          }
          if (frame.event === "gap") {
            on.gap(parseObject(frame.data));
            return;
          }
          if (frame.id !== undefined) lastId = frame.id;
          on.frame(frame);
        }
        lastProblem = "the connection ended before the answer did";
      }
    } catch (err) {
      if (options.signal?.aborted) return;
      lastProblem = err instanceof Error ? err.message : String(err);
    }
    const now = Date.now();
    failingSince ??= now;
    if (now - failingSince >= deadlineMs) {
      on.fail(new Error(`lost the answer stream for ${Math.round(deadlineMs / 1000)} s (${lastProblem})`));
      return;
    }
    const pause = Math.min(backoff, deadlineMs - (now - failingSince));
    await abortable(pause * (0.75 + Math.random() * 0.5), options.signal);
    backoff = Math.min(maxBackoff, backoff * 2);
  }
}

function parseObject(data: string): Record<string, unknown> {
  try {
    const parsed: unknown = JSON.parse(data);
    return parsed !== null && typeof parsed === "object" ? (parsed as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

function parseStatus(data: string): string {
  const status = parseObject(data)["status"];
  return typeof status === "string" ? status : "unknown";
}
