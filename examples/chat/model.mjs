// A stand-in for a language model, so the example runs with no provider: it streams a
// known answer word by word, slowly enough to reload or cut the network mid-answer. A
// prompt containing "[fail]" fails after three words, as a provider error mid-answer.

export const FAIL_MARK = "[fail]";

/** The whole answer to `prompt` (tests compute the same text). */
export function answerText(prompt, words) {
  const tail = Array.from({ length: words }, (_, i) => `word${i + 1}`);
  return ["Answer", "to", `«${prompt}»:`, ...tail].join(" ");
}

/** The answer's text deltas, one word (and its space) at a time. */
export async function* fakeModel(prompt, { words, delayMs }) {
  const pieces = answerText(prompt, words).split(" ");
  for (const [index, piece] of pieces.entries()) {
    if (prompt.includes(FAIL_MARK) && index === 3) {
      throw new Error("the model failed mid-answer");
    }
    await new Promise((resolve) => setTimeout(resolve, delayMs));
    yield index < pieces.length - 1 ? `${piece} ` : piece;
  }
}
