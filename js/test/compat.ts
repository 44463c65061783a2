// Type check only (tsc -p tsconfig.test.json): the adapter's context and options are
// assignable to resumable-stream's own, so code typed against it compiles unchanged.
import type { ResumableStreamContext as Upstream } from "resumable-stream";
import type { ChatTransport, UIMessage } from "ai";
import { createResumableStreamContext } from "../src/resumable.js";
import { GatewayChatTransport } from "../src/client.js";

export const context: Upstream = createResumableStreamContext({ waitUntil: null });
export const transport: ChatTransport<UIMessage> = new GatewayChatTransport({
  access: () => ({ gatewayUrl: "http://127.0.0.1:8000" }),
});
