// Everything an app's server needs: the producer, the AI SDK helper, request bodies,
// reader tokens, and a bridge from web Responses to node:http.
import type { ServerResponse } from "node:http";

export * from "./producer.js";
export * from "./ui.js";
export * from "./body.js";
export * from "./token.js";

/** Writes a web `Response` to a node:http response (for apps on plain node:http). */
export async function sendResponse(res: ServerResponse, response: Response): Promise<void> {
  res.writeHead(response.status, Object.fromEntries(response.headers.entries()));
  if (!response.body) {
    res.end();
    return;
  }
  for await (const piece of response.body as unknown as AsyncIterable<Uint8Array>) {
    if (!res.write(piece)) await new Promise((resolve) => res.once("drain", resolve));
  }
  res.end();
}
