// POST /api/chat: useChat's send. Same-origin JSON only, bounded; claims the turn (the
// user message id is its idempotency key) and publishes the model's UI message stream
// into it after the response (`after`); answers 202 {runId}: the page reads the gateway.
import { after } from "next/server";
import * as gw from "@gateway/ai/server";
import { fakeUIMessageStream } from "../../../../chat/model.mjs";
import { gateway, model, owns } from "../../gateway.js";

export async function POST(req) {
  try {
    const origin = `${new URL(req.url).protocol}//${req.headers.get("host")}`; // as the browser named it
    const { id, message, idempotencyKey } = await gw.readChatRequest(req, { maxBytes: 256 * 1024, origin });
    if (!(await owns(id))) throw new gw.RequestError(403, "forbidden", "not your chat");
    const text = gw.textOf(message);
    const turn = await gw.claimTurn({
      ...gateway,
      sessionId: id,
      inputMessage: { messageId: message.id, role: "user", parts: [{ kind: "text", text }] },
      idempotencyKey, // the message id: a double submit follows the same turn
    });
    if (gw.isExistingTurn(turn)) return gw.turnResponse(turn, id);
    // A real app: streamText({model, messages, abortSignal: turn.signal}).toUIMessageStream()
    const stream = fakeUIMessageStream(text, { ...model, abortSignal: turn.signal });
    return gw.publishUIMessageStream(turn, stream, { waitUntil: after });
  } catch (err) {
    if (err instanceof gw.RequestError) return err.response();
    throw err;
  }
}
