// Bounded request bodies for the app's routes, for node:http and for web Requests.
import type { IncomingMessage } from "node:http";

export class RequestError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    detail: string,
  ) {
    super(detail);
    this.name = "RequestError";
  }

  /** The JSON error reply, `{error, detail}`. */
  response(): Response {
    return new Response(JSON.stringify({ error: this.code, detail: this.message }), {
      status: this.status,
      headers: { "Content-Type": "application/json" },
    });
  }
}

export interface BodyOptions {
  /** Largest body read, in bytes (default 1 MiB); a larger one is a 413, never read whole. */
  maxBytes?: number;
  /** The app's own origin: a browser request from any other origin is refused (403). */
  origin?: string | undefined;
}

type HeaderBag = { get(name: string): string | null };

function headerBag(req: IncomingMessage | Request): HeaderBag {
  if (req instanceof Request) return req.headers;
  return {
    get: (name: string) => {
      const value = req.headers[name.toLowerCase()];
      return Array.isArray(value) ? (value[0] ?? null) : (value ?? null);
    },
  };
}

/**
 * Refuses what a page on another site could send unasked: a cross-site `Origin` (or
 * `Sec-Fetch-Site: cross-site`) and any body that is not `application/json` (a form or
 * `text/plain` needs no preflight).
 */
export function checkJsonRequest(req: IncomingMessage | Request, origin?: string): void {
  const headers = headerBag(req);
  const site = headers.get("sec-fetch-site");
  const from = headers.get("origin");
  if (site === "cross-site" || site === "same-site" || (origin !== undefined && from !== null && from !== origin)) {
    throw new RequestError(403, "forbidden_origin", `requests from ${from ?? "another site"} are not accepted`);
  }
  const type = (headers.get("content-type") ?? "").split(";")[0]!.trim().toLowerCase();
  if (type !== "application/json") {
    throw new RequestError(415, "unsupported_media_type", "the body must be application/json");
  }
}

/** Reads a JSON body of at most `maxBytes` bytes (413 past it, 400 when not JSON). */
export async function readJsonBody(req: IncomingMessage | Request, options: BodyOptions = {}): Promise<unknown> {
  const max = options.maxBytes ?? 1024 * 1024;
  checkJsonRequest(req, options.origin);
  const declared = Number(headerBag(req).get("content-length") ?? NaN);
  if (declared > max) throw new RequestError(413, "too_large", `the body is over ${max} bytes`);
  const pieces: Uint8Array[] = [];
  let size = 0;
  const source: AsyncIterable<Uint8Array> =
    req instanceof Request
      ? ((req.body as unknown as AsyncIterable<Uint8Array> | null) ?? emptyIterable())
      : (req as AsyncIterable<Uint8Array>);
  for await (const piece of source) {
    size += piece.byteLength;
    if (size > max) {
      if (!(req instanceof Request)) req.resume(); // drain the rest unread; the reply goes out
      throw new RequestError(413, "too_large", `the body is over ${max} bytes`);
    }
    pieces.push(piece);
  }
  const text = new TextDecoder().decode(concat(pieces, size));
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new RequestError(400, "invalid_json", "the body is not JSON");
  }
}

async function* emptyIterable(): AsyncGenerator<Uint8Array> {}

function concat(pieces: Uint8Array[], size: number): Uint8Array {
  const out = new Uint8Array(size);
  let at = 0;
  for (const piece of pieces) {
    out.set(piece, at);
    at += piece.byteLength;
  }
  return out;
}

export interface ChatRequest<M = ChatMessage> {
  /** The chat's id: the gateway session. */
  id: string;
  messages: M[];
  /** The last message: the user's new one. */
  message: M;
  /** `submit-message` or `regenerate-message` (the AI SDK's trigger). */
  trigger: string;
  /**
   * The turn's idempotency key for `claimTurn`: the user message's id for a new message
   * (a double submit or a retried request gets the same turn); for a regeneration, the
   * transport's request id (each regeneration is a new turn, its retries are not).
   */
  idempotencyKey: string;
}

export interface ChatMessage {
  id: string;
  role: string;
  parts: Array<{ type: string; text?: string }>;
  [key: string]: unknown;
}

const ID = /^[A-Za-z0-9._:-]{1,200}$/;

/**
 * Reads what `useChat` sends (`{id, messages}`), bounded, same-origin JSON only, and checks
 * its shape: a chat id and a message list ending with a user message that has an id.
 */
export async function readChatRequest(
  req: IncomingMessage | Request,
  options: BodyOptions & { maxMessages?: number } = {},
): Promise<ChatRequest> {
  const body = (await readJsonBody(req, options)) as Record<string, unknown> | null;
  const id = body?.["id"];
  const messages = body?.["messages"];
  if (typeof id !== "string" || !ID.test(id)) {
    throw new RequestError(400, "invalid_input", "id must be 1..200 of A-Z a-z 0-9 . _ : -");
  }
  if (!Array.isArray(messages) || messages.length === 0 || messages.length > (options.maxMessages ?? 1000)) {
    throw new RequestError(400, "invalid_input", "messages must be a non-empty list");
  }
  const message = messages[messages.length - 1] as ChatMessage | null;
  if (message?.role !== "user" || typeof message.id !== "string" || !ID.test(message.id) || !Array.isArray(message.parts)) {
    throw new RequestError(400, "invalid_input", "the last message must be a user message with an id and parts");
  }
  const trigger = typeof body?.["trigger"] === "string" ? body["trigger"] : "submit-message";
  const requestId = body?.["requestId"];
  let idempotencyKey = message.id;
  if (trigger === "regenerate-message") {
    if (typeof requestId !== "string" || !ID.test(requestId) || requestId.length > 100) {
      throw new RequestError(400, "invalid_input", "a regeneration needs a requestId");
    }
    idempotencyKey = `${message.id.slice(0, 90)}:regen:${requestId}`;
  }
  return { id, messages: messages as ChatMessage[], message, trigger, idempotencyKey };
}

/** The text of a UI message (its text parts, joined). */
export function textOf(message: ChatMessage): string {
  return message.parts
    .filter((part) => part.type === "text" && typeof part.text === "string")
    .map((part) => part.text)
    .join("");
}
