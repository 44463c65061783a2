// The browser side: a `ChatTransport` for the AI SDK's `useChat` that sends through the
// app's route and follows the answer on the gateway, resuming after any dropped stream.
import type { ChatRequestOptions, ChatTransport, UIMessage, UIMessageChunk } from "ai";
import { followRun } from "./follow.js";

export interface GatewayAccess {
  /** The gateway's base URL as the browser reaches it. */
  gatewayUrl: string;
  /** A reader token for this chat (from the app's server); none on an open gateway. */
  token?: string | null | undefined;
}

export interface GatewayChatTransportOptions {
  /** The app's route that starts a turn (default `/api/chat`); it answers `{runId}`. */
  api?: string;
  /** The gateway address and a reader token for a chat; `refresh` after a 401/403. */
  access: (chatId: string, refresh: boolean) => Promise<GatewayAccess> | GatewayAccess;
  /** Extra headers and credentials for the app's route. */
  headers?: Record<string, string>;
  credentials?: RequestCredentials;
  /** Give up with an error after this long without a working stream (ms, default 30000). */
  resumeDeadlineMs?: number;
  /** Pauses between attempts: from 250 ms, doubling, at most this (ms, default 2000). */
  maxBackoffMs?: number;
  fetch?: typeof fetch;
}

type SendOptions<M extends UIMessage> = Parameters<ChatTransport<M>["sendMessages"]>[0];
type ReconnectOptions<M extends UIMessage> = Parameters<ChatTransport<M>["reconnectToStream"]>[0];

const abortError = (signal: AbortSignal): unknown =>
  signal.reason instanceof Error && signal.reason.name === "AbortError"
    ? signal.reason
    : new DOMException("the answer was stopped", "AbortError");

/**
 * `new Chat({id, transport: new GatewayChatTransport({access})})`:
 * - send: POST `{id, messages, trigger, messageId}` to the app's route, which claims the
 *   turn (the user message id is its idempotency key: a double submit follows one turn)
 *   and answers `{runId}`; the answer is then read from the gateway's run stream;
 * - any stream failure (a proxy cut, a restart, offline): reconnect with the last event
 *   id, pausing 250 ms doubling to 2 s, until `resumeDeadlineMs` without success;
 * - stop (the request's abort): `POST /v1/runs/{id}/cancel` on the gateway; the model
 *   stops and the turn ends `cancelled` with what it had said;
 * - resume (`useChat({resume: true})`): the session's running turn from its first chunk,
 *   or `null` when none runs.
 */
export class GatewayChatTransport<M extends UIMessage = UIMessage> implements ChatTransport<M> {
  /** A resumed answer is replayed from its first chunk. */
  readonly resumeStreamIsReplay = true;
  private readonly options: GatewayChatTransportOptions;
  private readonly accessCache = new Map<string, Promise<GatewayAccess>>();

  constructor(options: GatewayChatTransportOptions) {
    this.options = options;
  }

  /** The gateway address and token for `chatId` (cached; `refresh` asks again). */
  access(chatId: string, refresh = false): Promise<GatewayAccess> {
    let cached = this.accessCache.get(chatId);
    if (!cached || refresh) {
      cached = Promise.resolve(this.options.access(chatId, refresh));
      this.accessCache.set(chatId, cached);
      cached.catch(() => this.accessCache.delete(chatId));
    }
    return cached;
  }

  private get fetch(): typeof fetch {
    return this.options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  async sendMessages(options: SendOptions<M>): Promise<ReadableStream<UIMessageChunk>> {
    const { chatId, messages, abortSignal, trigger, messageId } = options;
    const extra = options as ChatRequestOptions;
    const response = await this.fetch(this.options.api ?? "/api/chat", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...this.options.headers, ...headersOf(extra.headers) },
      credentials: this.options.credentials ?? "same-origin",
      // requestId: the same for a retry of this request, new for each regeneration
      body: JSON.stringify({ ...(extra.body ?? {}), id: chatId, messages, trigger, messageId, requestId: newId() }),
      ...(abortSignal ? { signal: abortSignal } : {}),
    });
    const reply = (await response.json().catch(() => ({}))) as Record<string, unknown>;
    if (!response.ok || typeof reply["runId"] !== "string") {
      const detail = typeof reply["detail"] === "string" ? reply["detail"] : `status ${response.status}`;
      throw new Error(`the chat route refused the message: ${detail}`);
    }
    return this.follow(chatId, reply["runId"], abortSignal);
  }

  async reconnectToStream(options: ReconnectOptions<M>): Promise<ReadableStream<UIMessageChunk> | null> {
    const signal = (options as { abortSignal?: AbortSignal }).abortSignal;
    const runId = await this.runningTurn(options.chatId);
    return runId === null ? null : this.follow(options.chatId, runId, signal);
  }

  /** The run id of the chat's running turn, or null. */
  async runningTurn(chatId: string): Promise<string | null> {
    const turns = (await this.gatewayGet(chatId, "turns?limit=1")) as { turns?: Array<Record<string, unknown>> };
    const last = turns.turns?.at(-1);
    return last && last["state"] === "running" && typeof last["run_id"] === "string" ? last["run_id"] : null;
  }

  /** The chat's history as `UIMessage[]` (a running turn lists its user message only). */
  async loadMessages(chatId: string): Promise<M[]> {
    return (await this.gatewayGet(chatId, "ui-messages")) as M[];
  }

  /** Asks the gateway to stop a run (what `stop()` does). */
  async cancel(chatId: string, runId: string): Promise<void> {
    const access = await this.access(chatId);
    const response = await this.fetch(`${base(access)}/v1/runs/${encodeURIComponent(runId)}/cancel`, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...bearer(access) },
      body: "{}",
      keepalive: true, // a stop pressed just before a reload still reaches the gateway
    });
    if (!response.ok && response.status !== 404) throw new Error(`cancel: ${response.status}`);
  }

  private async gatewayGet(chatId: string, route: string): Promise<unknown> {
    for (const refresh of [false, true]) {
      const access = await this.access(chatId, refresh);
      const response = await this.fetch(`${base(access)}/v1/sessions/${encodeURIComponent(chatId)}/${route}`, {
        headers: bearer(access),
        cache: "no-store",
      });
      if ((response.status === 401 || response.status === 403) && !refresh) continue;
      if (!response.ok) throw new Error(`gateway ${route}: ${response.status} ${await response.text()}`);
      return response.json();
    }
    throw new Error("unreachable");
  }

  /** The run's `ui` events as UI message chunks, resumed across any failure. */
  private follow(chatId: string, runId: string, abortSignal: AbortSignal | undefined): ReadableStream<UIMessageChunk> {
    const inner = new AbortController();
    let sawError = false;
    let finished = false;
    return new ReadableStream<UIMessageChunk>({
      start: (controller) => {
        const close = (): void => {
          if (finished) return;
          finished = true;
          controller.close();
        };
        const fail = (error: unknown): void => {
          if (finished) return;
          finished = true;
          controller.error(error);
        };
        const onAbort = (): void => {
          inner.abort();
          if (finished) return;
          void this.cancel(chatId, runId).catch(() => undefined); // stop is not disconnect
          fail(abortError(abortSignal!));
        };
        if (abortSignal?.aborted) return onAbort();
        abortSignal?.addEventListener("abort", onAbort, { once: true });
        void this.access(chatId).then((first) =>
          followRun(
            {
              url: `${base(first)}/v1/runs/${encodeURIComponent(runId)}/stream`,
              headers: async (refresh) => bearer(await this.access(chatId, refresh)),
              signal: inner.signal,
              deadlineMs: this.options.resumeDeadlineMs,
              maxBackoffMs: this.options.maxBackoffMs,
              fetch: this.options.fetch,
            },
            {
              frame: (frame) => {
                if (frame.event !== "ui" || finished) return;
                const chunk = JSON.parse(frame.data) as UIMessageChunk;
                if (chunk.type === "error") sawError = true;
                controller.enqueue(chunk);
              },
              end: (status) => {
                if (status !== undefined && status !== "success" && status !== "cancelled" && !sawError && !finished) {
                  controller.enqueue({ type: "error", errorText: endText(status) });
                }
                close();
              },
              gap: (detail) => {
                if (!finished) {
                  const reason = typeof detail["reason"] === "string" ? detail["reason"] : "gap";
                  controller.enqueue({ type: "error", errorText: `the answer is no longer available (${reason})` });
                }
                close();
              },
              fail,
            },
          ),
          fail,
        ).finally(() => abortSignal?.removeEventListener("abort", onAbort));
      },
      cancel: () => {
        finished = true;
        inner.abort(); // the reader went away; the run goes on
      },
    });
  }
}

function newId(): string {
  return globalThis.crypto.randomUUID();
}

function endText(status: string): string {
  if (status === "producer_lost") return "the answer was lost: its producer stopped (producer_lost)";
  return `the answer ended with status ${status}`;
}

function base(access: GatewayAccess): string {
  return access.gatewayUrl.replace(/\/+$/, "");
}

function bearer(access: GatewayAccess): Record<string, string> {
  return access.token ? { Authorization: `Bearer ${access.token}` } : {};
}

function headersOf(headers: ChatRequestOptions["headers"]): Record<string, string> {
  if (!headers) return {};
  if (headers instanceof Headers) return Object.fromEntries(headers.entries());
  return headers as Record<string, string>;
}
