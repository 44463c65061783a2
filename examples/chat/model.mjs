// A stand-in for a language model, so the example runs with no provider: it streams a
// known answer word by word, slowly enough to reload, cut the network or stop mid-answer,
// as the UI message chunks `streamText(...).toUIMessageStream()` yields for a text reply.
// A prompt containing "[fail]" fails after three words, as a provider error mid-answer
// (an `error` chunk, as the AI SDK sends one). It stops when `abortSignal` fires.

export const FAIL_MARK = "[fail]";

/** The whole answer to `prompt` (tests compute the same text). */
export function answerText(prompt, words) {
  const tail = Array.from({ length: words }, (_, i) => `word${i + 1}`);
  return ["Answer", "to", `«${prompt}»:`, ...tail].join(" ");
}

/** What `streamText({model, messages, abortSignal}).toUIMessageStream()` would return. */
export function fakeUIMessageStream(prompt, { words, delayMs, abortSignal, onAbort }) {
  const pieces = answerText(prompt, words).split(" ");
  const chunks = [{ type: "start" }, { type: "start-step" }, { type: "text-start", id: "text" }];
  let index = 0;
  return new ReadableStream({
    async pull(controller) {
      if (chunks.length) return controller.enqueue(chunks.shift());
      await new Promise((resolve) => setTimeout(resolve, delayMs));
      if (abortSignal?.aborted) {
        onAbort?.();
        controller.enqueue({ type: "abort" });
        return controller.close();
      }
      if (prompt.includes(FAIL_MARK) && index === 3) {
        controller.enqueue({ type: "error", errorText: "the model failed mid-answer" });
        return controller.close();
      }
      if (index < pieces.length) {
        const piece = pieces[index++];
        return controller.enqueue({ type: "text-delta", id: "text", delta: index < pieces.length ? `${piece} ` : piece });
      }
      for (const chunk of [{ type: "text-end", id: "text" }, { type: "finish-step" }, { type: "finish" }]) {
        controller.enqueue(chunk);
      }
      controller.close();
    },
  });
}
