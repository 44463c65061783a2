// A small server-sent-events reader over a fetch body, shared by the browser transport
// and the resumable-stream adapter (no dependency: it runs in a browser bundle as is).

export interface SSEFrame {
  id: string | undefined;
  event: string;
  data: string;
}

/** Yields each dispatched frame of an SSE body; comments and `retry:` lines are skipped. */
export async function* readSSE(body: ReadableStream<Uint8Array>): AsyncGenerator<SSEFrame> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let id: string | undefined;
  let event = "";
  let data: string[] = [];
  let seen = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffer.search(/\r\n|\r|\n/)) !== -1) {
        const line = buffer.slice(0, newline);
        const width = buffer.startsWith("\r\n", newline) ? 2 : 1;
        if (buffer[newline] === "\r" && newline + 1 === buffer.length) break; // \r\n may be split
        buffer = buffer.slice(newline + width);
        if (line === "") {
          if (seen) yield { id, event: event || "message", data: data.join("\n") };
          event = "";
          data = [];
          seen = false;
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon === -1 ? line : line.slice(0, colon);
        let value = colon === -1 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") {
          data.push(value);
          seen = true;
        } else if (field === "event") {
          event = value;
          seen = true;
        } else if (field === "id" && !value.includes("\0")) {
          id = value;
        }
      }
    }
  } finally {
    reader.releaseLock();
  }
}
