// The AI SDK server helper: a UI message stream (`streamText(...).toUIMessageStream()`)
// published into a claimed turn, one `ui` event per chunk, ended with its true status.
import type { UIMessageChunk } from "ai";
import type { ExistingTurn, Turn } from "./producer.js";

export type TurnOutcome = "success" | "error" | "cancelled";

export interface PublishOptions {
  /** Keep each `start` chunk's own messageId (default: it becomes the run id, so the live
   * message, a replay and the history's assistant message are one message). */
  keepMessageId?: boolean;
  /** Serverless hosts: keeps the function alive until the turn ends (Next.js `after`). */
  waitUntil?: (promise: Promise<unknown>) => void;
  /** Told about a turn that could not be ended (the gateway unreachable). */
  onError?: (error: unknown) => void;
}

const messageOf = (err: unknown): string => (err instanceof Error ? err.message : String(err));

/**
 * Publishes every chunk of `stream` as an event named `ui` and ends the turn: `success`;
 * `error` with the reason when the stream carried an `error` chunk or threw; `cancelled`
 * when the turn's signal fired (a reader pressed stop), keeping what was published.
 */
export async function pipeUIMessageStream(
  turn: Turn,
  stream: ReadableStream<UIMessageChunk>,
  options: PublishOptions = {},
): Promise<TurnOutcome> {
  const reader = stream.getReader();
  let errorText: string | undefined;
  let outcome: TurnOutcome;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      let chunk = value;
      if (chunk.type === "start" && !options.keepMessageId) chunk = { ...chunk, messageId: turn.runId };
      if (chunk.type === "error") errorText ??= chunk.errorText;
      await turn.send("ui", chunk);
    }
    outcome = errorText !== undefined ? "error" : turn.signal.aborted && !turn.error ? "cancelled" : "success";
  } catch (err) {
    if (turn.signal.aborted && !turn.error) {
      outcome = "cancelled"; // the model stopped because a reader asked
    } else {
      errorText = messageOf(err); // readers see why, as the AI SDK shows a model's error
      await turn.send("ui", { type: "error", errorText }).catch(() => undefined);
      outcome = "error";
    }
    await reader.cancel(err).catch(() => undefined);
  }
  try {
    await turn.end(outcome, outcome === "error" ? { message: errorText } : undefined);
  } catch (err) {
    options.onError?.(err);
  }
  return outcome;
}

/** The route's answer: `202 {runId, sessionId}`; the browser follows the run on the gateway. */
export function turnResponse(turn: Turn | ExistingTurn, sessionId?: string): Response {
  const body =
    "existing" in turn
      ? { runId: turn.existing, sessionId, existing: true }
      : { runId: turn.runId, sessionId: turn.sessionId, existing: false };
  return new Response(JSON.stringify(body), {
    status: 202,
    headers: { "Content-Type": "application/json", "Cache-Control": "no-store" },
  });
}

/**
 * One call for a route handler: publishes `stream` into `turn` in the background and
 * answers at once with `turnResponse(turn)`. The answer does not depend on this request:
 * a client that leaves (reload, lost network) changes nothing; only a cancel stops it.
 */
export function publishUIMessageStream(
  turn: Turn,
  stream: ReadableStream<UIMessageChunk>,
  options: PublishOptions = {},
): Response {
  const done = pipeUIMessageStream(turn, stream, options).catch((err: unknown) => options.onError?.(err));
  options.waitUntil?.(done);
  return turnResponse(turn);
}
