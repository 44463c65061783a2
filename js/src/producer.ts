// The producer side of a turn, for Node >= 20 route handlers: claim the turn, stream its
// events through ONE streamed NDJSON append, end it with its true status.
//
// Delivery: every event gets a number (X-Producer-Seq). The gateway acknowledges what it
// appended with the next number it expects; events are kept until acknowledged. After a
// dropped connection the turn reconnects and sends again from the first unacknowledged
// number: the gateway applies a number once, so the overlap is harmless. When no ack comes
// back within `ackTimeoutMs` of a line (a proxy that buffers the request or the response),
// the turn falls back to numbered batch POSTs for the rest of its life.

export type EndStatus = "success" | "error" | "cancelled";

export interface GatewayOptions {
  /** The gateway's base URL, e.g. http://127.0.0.1:8000 */
  gatewayUrl: string;
  /** A producer API key; omit for an open loopback gateway. */
  apiKey?: string | undefined;
  /** For tests and custom agents; the global fetch by default. */
  fetch?: typeof fetch;
}

export interface ClaimTurnOptions extends GatewayOptions {
  sessionId: string;
  /** Stored with the turn: the user's message (any JSON). */
  inputMessage?: unknown;
  /** The client's message id: a second claim with it gets the turn already running. */
  idempotencyKey?: string | undefined;
  runId?: string | undefined;
  leaseSeconds?: number | undefined;
  metadata?: Record<string, unknown> | undefined;
  /** Ms without an ack after a line before falling back to batches (default 2000). */
  ackTimeoutMs?: number | undefined;
  /** "stream" (default, falls back by itself) or "batch" (one numbered POST at a time). */
  mode?: "stream" | "batch" | undefined;
  /** How long a turn keeps retrying a gateway it cannot reach before failing (ms, 30000). */
  retryDeadlineMs?: number | undefined;
}

export interface ExistingTurn {
  /** The run already started with the same idempotency key. */
  existing: string;
}

export class GatewayError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    detail: string,
    readonly reply: Record<string, unknown> = {},
  ) {
    super(`gateway ${status} ${code}: ${detail}`);
    this.name = "GatewayError";
  }
}

interface ClaimReply {
  run_id: string;
  session_id: string;
  producer_token: string;
  epoch: number;
  lease_expires_at: number;
}

const RETRYABLE = new Set([408, 429, 500, 502, 503, 504]);
// Error lines of a streamed append after which the same lines may be sent again.
const RETRY_LINE_CODES = new Set(["body_idle", "bridge_closed", "backend_unavailable", "token_expired"]);

function authHeaders(apiKey: string | undefined): Record<string, string> {
  return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
}

async function replyJson(response: Response): Promise<Record<string, unknown>> {
  const text = await response.text();
  try {
    const parsed: unknown = JSON.parse(text);
    return parsed !== null && typeof parsed === "object" ? (parsed as Record<string, unknown>) : {};
  } catch {
    return { detail: text.slice(0, 200) };
  }
}

function errorOf(status: number, reply: Record<string, unknown>): GatewayError {
  const str = (v: unknown, fallback: string): string => (typeof v === "string" ? v : fallback);
  return new GatewayError(status, str(reply["error"], "http_error"), str(reply["detail"], ""), reply);
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Claims a turn of `sessionId`. Returns a `Turn` to stream into, or `{existing: runId}` when
 * the idempotency key already started one (a double submit, a second tab): follow that run.
 */
export async function claimTurn(options: ClaimTurnOptions): Promise<Turn | ExistingTurn> {
  const doFetch = options.fetch ?? fetch;
  const base = options.gatewayUrl.replace(/\/+$/, "");
  const body: Record<string, unknown> = { session_id: options.sessionId };
  if (options.inputMessage !== undefined) body["input_message"] = options.inputMessage;
  if (options.idempotencyKey !== undefined) body["idempotency_key"] = options.idempotencyKey;
  if (options.runId !== undefined) body["run_id"] = options.runId;
  if (options.leaseSeconds !== undefined) body["lease_seconds"] = options.leaseSeconds;
  if (options.metadata !== undefined) body["metadata"] = options.metadata;
  const deadline = Date.now() + (options.retryDeadlineMs ?? 30_000);
  for (let attempt = 0; ; attempt++) {
    let response: Response;
    try {
      // A retried claim is safe only with an idempotency key (or a fixed run id).
      response = await doFetch(`${base}/v1/runs`, {
        method: "POST",
        headers: { "Content-Type": "application/json", ...authHeaders(options.apiKey) },
        body: JSON.stringify(body),
      });
    } catch (err) {
      const safe = options.idempotencyKey !== undefined || options.runId !== undefined;
      if (!safe || Date.now() > deadline) throw err;
      await sleep(Math.min(2000, 100 * 2 ** attempt));
      continue;
    }
    const reply = await replyJson(response);
    if (response.status === 409 && reply["error"] === "turn_exists" && typeof reply["run_id"] === "string") {
      return { existing: reply["run_id"] };
    }
    if (!response.ok) {
      const safe = options.idempotencyKey !== undefined || options.runId !== undefined;
      if (safe && RETRYABLE.has(response.status) && Date.now() < deadline) {
        await sleep(Math.min(2000, 100 * 2 ** attempt));
        continue;
      }
      throw errorOf(response.status, reply);
    }
    return new Turn(reply as unknown as ClaimReply, base, options);
  }
}

export function isExistingTurn(claim: Turn | ExistingTurn): claim is ExistingTurn {
  return !(claim instanceof Turn);
}

interface Pending {
  seq: number;
  line: string; // one JSON object, no newline
}

/** A controllable request body: lines are pushed as they come. */
interface Connection {
  controller: ReadableStreamDefaultController<Uint8Array>;
  abort: AbortController;
  sentThrough: number; // the last number written to this body
  closed: boolean; // the body is ended (the turn is ending)
  done: Promise<void>; // settles when the response ends, however
}

const encoder = new TextEncoder();

/**
 * One claimed turn. `send` queues an event (numbered, kept until the gateway acknowledges
 * it); `end` flushes and ends the run with its status. `signal` fires when a reader asked
 * to cancel (hand it to `streamText({abortSignal})`).
 */
export class Turn {
  readonly runId: string;
  readonly sessionId: string;
  /** Fires when the gateway reports `cancel_requested` (a reader pressed stop). */
  readonly signal: AbortSignal;
  /** "stream" while the streamed append works; "batch" after a fallback. */
  mode: "stream" | "batch";

  private readonly cancel = new AbortController();
  private readonly base: string;
  private readonly headers: Record<string, string>;
  private readonly doFetch: typeof fetch;
  private readonly ackTimeoutMs: number;
  private readonly retryDeadlineMs: number;
  private readonly leaseMs: number;
  private pending: Pending[] = [];
  private nextSeq = 1;
  private conn: Connection | undefined;
  private ackTimer: ReturnType<typeof setTimeout> | undefined;
  private leaseTimer: ReturnType<typeof setInterval> | undefined;
  private lastActivity = Date.now(); // the last word with the gateway: a send, an ack, a reply
  private lastSend = Date.now();
  private failure: Error | undefined;
  private ended = false;
  private pumping: Promise<void> | undefined;
  private failingSince: number | undefined;
  private backingOff: Promise<void> | undefined;
  private streamFailures = 0;
  private waiters: Array<() => void> = [];
  private readonly connections: Set<Promise<void>> = new Set();

  constructor(claim: ClaimReply, base: string, options: ClaimTurnOptions) {
    this.runId = claim.run_id;
    this.sessionId = claim.session_id;
    this.signal = this.cancel.signal;
    this.base = base;
    this.doFetch = options.fetch ?? fetch;
    this.headers = { "X-Producer-Token": claim.producer_token, ...authHeaders(options.apiKey) };
    this.ackTimeoutMs = options.ackTimeoutMs ?? 2000;
    this.retryDeadlineMs = options.retryDeadlineMs ?? 30_000;
    this.mode = options.mode ?? "stream";
    this.leaseMs = Math.max(1, options.leaseSeconds ?? 30) * 1000;
    // While the model is silent no ack comes back: a lease renewal keeps the run owned
    // and brings the cancel flag. unref: a turn never keeps a process alive by itself.
    this.leaseTimer = setInterval(() => void this.idleTick(), Math.min(1000, this.leaseMs / 3));
    this.leaseTimer.unref?.();
  }

  /** Why the turn can no longer deliver (the gateway refused it, or stayed unreachable). */
  get error(): Error | undefined {
    return this.failure;
  }

  /** Events not yet acknowledged by the gateway. */
  get unacknowledged(): number {
    return this.pending.length;
  }

  /**
   * Queues one event. Resolves at once unless more than `highWater` events wait for an
   * ack (then when they drop below it), so a fast model never grows memory without bound.
   */
  async send(event: string, data: unknown, highWater = 10_000): Promise<void> {
    if (this.ended) throw new Error(`turn ${this.runId} has ended`);
    if (this.failure) throw this.failure;
    const line = JSON.stringify({ event, data });
    const item = { seq: this.nextSeq++, line };
    this.pending.push(item);
    this.lastActivity = this.lastSend = Date.now();
    if (this.mode === "stream" && this.conn && !this.conn.closed && this.conn.sentThrough === item.seq - 1) {
      this.write(this.conn, [item]);
    } else {
      this.kick();
    }
    while (this.pending.length > highWater && !this.failure) {
      await new Promise<void>((resolve) => this.waiters.push(resolve));
    }
    if (this.failure) throw this.failure;
  }

  /** Waits until every queued event is acknowledged. */
  async flush(): Promise<void> {
    while (this.pending.length > 0) {
      if (this.failure) throw this.failure;
      this.kick();
      await new Promise<void>((resolve) => this.waiters.push(resolve));
    }
    if (this.failure) throw this.failure;
  }

  /**
   * Flushes, then ends the run with `status` (`error` carries `error`). Idempotent on the
   * gateway's side; answers the gateway's END reply (`{id, deduplicated}`).
   */
  async end(status: EndStatus | string, error?: unknown): Promise<Record<string, unknown>> {
    if (this.ended) throw new Error(`turn ${this.runId} has ended`);
    let flushError: unknown;
    try {
      await this.flush();
    } catch (err) {
      flushError = err; // end anyway: the ending must be recorded
    }
    this.ended = true;
    if (this.conn && !this.conn.closed) this.closeBody(this.conn);
    // The gateway answers an ended body with its last ack; a connection that never does
    // (a peer gone without a reset) is dropped after a while: everything is acked by now.
    const settled = Promise.allSettled([...this.connections]);
    const late = setTimeout(() => this.conn?.abort.abort(new Error("no final ack")), 10_000);
    await settled;
    clearTimeout(late);
    this.stopTimers();
    const body: Record<string, unknown> = { status };
    if (error !== undefined) body["error"] = normaliseError(error);
    const reply = await this.post("/end", body);
    if (flushError !== undefined && status === "success") throw flushError;
    return reply;
  }

  /**
   * Runs `work(turn)` and ends the turn with its outcome: `success`; `cancelled` when a
   * reader asked to stop (the signal fired), keeping what was sent; `error` with the
   * exception's message when it threw. Answers the status it ended with.
   */
  async run(work: (turn: Turn) => Promise<void>): Promise<EndStatus> {
    let status: EndStatus;
    let reason: unknown;
    try {
      await work(this);
      status = this.signal.aborted && !this.failure ? "cancelled" : "success";
    } catch (err) {
      status = this.signal.aborted && !this.failure ? "cancelled" : "error";
      reason = status === "error" ? err : undefined;
    }
    await this.end(status, reason === undefined ? undefined : normaliseError(reason));
    return status;
  }

  /** Ends the turn `error` with the reason of `err` (an exception's message). */
  fail(err: unknown): Promise<Record<string, unknown>> {
    return this.end("error", normaliseError(err));
  }

  // -- delivery ------------------------------------------------------------------------

  private kick(): void {
    if (this.pumping || this.pending.length === 0 || this.failure) return;
    // pump() loops while it has work, so lines queued meanwhile are picked up by it
    this.pumping = this.pump().finally(() => {
      this.pumping = undefined;
    });
  }

  private async pump(): Promise<void> {
    while (this.pending.length > 0 && !this.failure) {
      if (this.mode === "batch") {
        await this.postBatch();
        continue;
      }
      if (this.conn && !this.conn.closed) {
        // a live body: write what it has not had yet
        const unsent = this.pending.filter((p) => p.seq > this.conn!.sentThrough);
        if (unsent.length) this.write(this.conn, unsent);
        return;
      }
      if (this.conn) await this.conn.done; // an ended body: its response settles first
      if (this.backingOff) await this.backingOff;
      if (this.conn || this.mode !== "stream" || this.failure || this.pending.length === 0) continue;
      this.conn = this.openStream();
      return;
    }
  }

  private openStream(): Connection {
    const first = this.pending[0]?.seq ?? this.nextSeq;
    let controller!: ReadableStreamDefaultController<Uint8Array>;
    const body = new ReadableStream<Uint8Array>({ start: (c) => void (controller = c) });
    const abort = new AbortController();
    const conn: Connection = { controller, abort, sentThrough: first - 1, closed: false, done: Promise.resolve() };
    if (this.ackTimer !== undefined) clearTimeout(this.ackTimer); // an older body's timer
    this.ackTimer = undefined;
    this.write(conn, this.pending);
    if (this.ended) this.closeBody(conn);
    const done = this.runStream(conn, body, first);
    conn.done = done;
    this.connections.add(done);
    void done.finally(() => this.connections.delete(done));
    return conn;
  }

  private write(conn: Connection, items: Pending[]): void {
    if (items.length === 0) return;
    const last = items[items.length - 1]!;
    try {
      conn.controller.enqueue(encoder.encode(items.map((p) => p.line + "\n").join("")));
    } catch {
      return; // the body is gone; the response side notices and reconnects
    }
    conn.sentThrough = last.seq;
    if (this.ackTimer === undefined) {
      this.ackTimer = setTimeout(() => this.ackTimeout(conn), this.ackTimeoutMs);
    }
  }

  private closeBody(conn: Connection): void {
    conn.closed = true;
    try {
      conn.controller.close();
    } catch {
      // already closed or errored
    }
  }

  private ackTimeout(conn: Connection): void {
    this.ackTimer = undefined;
    if (conn !== this.conn || this.pending.length === 0 || this.mode !== "stream") return;
    // Lines went out and nothing came back: something between holds the acks (or the
    // body). Numbered batches get through such a proxy; the overlap is applied once.
    this.mode = "batch";
    conn.abort.abort(new Error("no ack: falling back to batches"));
    this.kick();
  }

  private acked(nextSeq: number, cancelRequested: boolean): void {
    this.lastActivity = Date.now();
    if (cancelRequested && !this.cancel.signal.aborted) {
      this.cancel.abort(new Error("a reader asked to cancel the turn"));
    }
    const before = this.pending.length;
    while (this.pending.length > 0 && this.pending[0]!.seq < nextSeq) this.pending.shift();
    if (this.pending.length !== before || this.pending.length === 0) {
      this.failingSince = undefined;
      this.streamFailures = 0;
      if (this.ackTimer !== undefined) clearTimeout(this.ackTimer);
      this.ackTimer = undefined;
      if (this.pending.length > 0 && this.conn && this.conn.sentThrough >= this.pending[0]!.seq) {
        this.ackTimer = setTimeout(() => this.ackTimeout(this.conn!), this.ackTimeoutMs);
      }
    }
    this.wake();
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const resolve of waiters) resolve();
  }

  private setFailure(err: Error): void {
    if (this.failure) return;
    this.failure = err;
    this.stopTimers();
    if (!this.cancel.signal.aborted) this.cancel.abort(err); // stop the model: nothing gets through
    this.wake();
  }

  private stopTimers(): void {
    if (this.ackTimer !== undefined) clearTimeout(this.ackTimer);
    this.ackTimer = undefined;
    if (this.leaseTimer !== undefined) clearInterval(this.leaseTimer);
    this.leaseTimer = undefined;
  }

  /** A failed attempt: retry until `retryDeadlineMs` of failures in a row, then give up. */
  private async backoff(err: unknown, attempt: number): Promise<void> {
    const now = Date.now();
    this.failingSince ??= now;
    if (now - this.failingSince > this.retryDeadlineMs) {
      this.setFailure(new Error(`the gateway did not accept turn ${this.runId}'s events: ${String(err)}`));
      return;
    }
    await sleep(Math.min(2000, 50 * 2 ** Math.min(attempt, 6)));
  }

  private async runStream(conn: Connection, body: ReadableStream<Uint8Array>, first: number): Promise<void> {
    let problem: unknown;
    let finished = false;
    try {
      const response = await this.doFetch(`${this.base}/v1/runs/${this.runId}/events`, {
        method: "POST",
        headers: { ...this.headers, "Content-Type": "application/x-ndjson", "X-Producer-Seq": String(first) },
        body,
        signal: conn.abort.signal,
        duplex: "half",
      } as RequestInit);
      if (!response.ok || !response.body) {
        const reply = await replyJson(response);
        throw errorOf(response.status, reply);
      }
      const lines = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await lines.read();
        if (done) break;
        buffer += value;
        let newline: number;
        while ((newline = buffer.indexOf("\n")) !== -1) {
          const text = buffer.slice(0, newline).trim();
          buffer = buffer.slice(newline + 1);
          if (!text) continue;
          const ack = JSON.parse(text) as Record<string, unknown>;
          if (typeof ack["error"] === "string") throw errorOf(409, ack);
          if (ack["done"] === true) {
            finished = true;
            continue;
          }
          const next = typeof ack["next_seq"] === "number" ? ack["next_seq"] : undefined;
          const ids = Array.isArray(ack["ids"]) ? ack["ids"].length : 0;
          this.acked(next ?? (this.pending[0]?.seq ?? this.nextSeq) + ids, ack["cancel_requested"] === true);
        }
      }
    } catch (err) {
      problem = err;
    }
    this.closeBody(conn);
    if (this.conn === conn) this.conn = undefined;
    if (conn.abort.signal.aborted) return; // replaced on purpose (the fallback to batches)
    if (problem instanceof GatewayError) {
      const next = problem.reply["next_seq"];
      if (typeof next === "number") this.acked(next, false);
      if (problem.code === "too_many_streams") {
        this.mode = "batch"; // the gateway's streamed-append limit: batches still work
      } else if (problem.code === "sequence_gap" && typeof next === "number") {
        // the gateway expects an earlier number than this body started with
        if (!this.pending.length || this.pending[0]!.seq > next) this.setFailure(problem);
      } else if (!RETRYABLE.has(problem.status) && !RETRY_LINE_CODES.has(problem.code)) {
        this.setFailure(problem); // fenced, ended, a refused line: retrying cannot help
        return;
      }
    }
    if (!finished && this.pending.length > 0 && !this.failure && this.mode === "stream") {
      // a dropped connection: reconnect after a pause, from the first unacknowledged line
      this.backingOff = this.backoff(problem, this.streamFailures++);
      await this.backingOff;
      this.backingOff = undefined;
    } else if (finished) {
      this.streamFailures = 0;
    }
    this.wake();
    this.kick();
  }

  private async postBatch(): Promise<void> {
    let attempt = 0;
    while (this.pending.length > 0 && !this.failure) {
      const batch = this.pending.slice(0, 500);
      try {
        const reply = await this.post("/events", undefined, batch);
        const ids = Array.isArray(reply["ids"]) ? reply["ids"].length : batch.length;
        this.acked(batch[0]!.seq + ids, reply["cancel_requested"] === true);
        attempt = 0;
      } catch (err) {
        if (err instanceof GatewayError && !RETRYABLE.has(err.status)) {
          this.setFailure(err);
          return;
        }
        await this.backoff(err, attempt++);
      }
    }
  }

  /** One JSON POST under the producer token, retried on a dropped connection or a 503. */
  private async post(path: string, body: unknown, batch?: Pending[]): Promise<Record<string, unknown>> {
    const headers: Record<string, string> = { ...this.headers, "Content-Type": "application/json" };
    let payload: string;
    if (batch) {
      headers["X-Producer-Seq"] = String(batch[0]!.seq);
      payload = `{"events":[${batch.map((p) => p.line).join(",")}]}`;
    } else {
      payload = JSON.stringify(body);
    }
    const deadline = Date.now() + this.retryDeadlineMs;
    for (let attempt = 0; ; attempt++) {
      let response: Response;
      try {
        response = await this.doFetch(`${this.base}/v1/runs/${this.runId}${path}`, {
          method: "POST",
          headers,
          body: payload,
        });
      } catch (err) {
        if (batch || Date.now() > deadline) throw err; // a batch retries in postBatch
        await sleep(Math.min(2000, 100 * 2 ** attempt));
        continue;
      }
      const reply = await replyJson(response);
      if (response.ok) {
        this.lastActivity = Date.now();
        return reply;
      }
      if (!batch && RETRYABLE.has(response.status) && Date.now() < deadline) {
        await sleep(Math.min(2000, 100 * 2 ** attempt));
        continue;
      }
      throw errorOf(response.status, reply);
    }
  }

  private async idleTick(): Promise<void> {
    if (this.ended || this.failure) return;
    const now = Date.now();
    // A body idle for as long as the lease is refused: a silent model (a long tool call)
    // ends its body cleanly first; the next event opens a new one.
    const conn = this.conn;
    if (conn && !conn.closed && this.pending.length === 0 && now - this.lastSend >= this.leaseMs / 2) {
      this.closeBody(conn);
    }
    if (now - this.lastActivity < 1000) return;
    this.lastActivity = now;
    try {
      const reply = await this.post("/lease", {});
      if (reply["cancel_requested"] === true && !this.cancel.signal.aborted) {
        this.cancel.abort(new Error("a reader asked to cancel the turn"));
      }
    } catch (err) {
      if (err instanceof GatewayError && (err.code === "fenced" || err.code === "ended")) this.setFailure(err);
    }
  }
}

function normaliseError(err: unknown): unknown {
  if (err instanceof Error) return { message: err.message };
  if (typeof err === "string") return { message: err };
  return err;
}
