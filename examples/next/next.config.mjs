// The repository is the root: @gateway/ai is linked from ../../js and the stand-in model
// is the chat example's (../chat/model.mjs).
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../..", import.meta.url));

export default {
  turbopack: { root },
  outputFileTracingRoot: root,
  distDir: process.env.NEXT_DIST_DIR ?? ".next",
};
