// Builds the page into dist/<set>/. CHAT_AI_SET picks the npm version set the bundle is
// built with: "ai6" (this folder's node_modules: ai 6, @ai-sdk/react 3) or "ai7"
// (ai7/node_modules: ai 7, @ai-sdk/react 4). The sources are the same; React is taken
// from the chosen set too, so the page and @ai-sdk/react share one copy of it.
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

const set = process.env.CHAT_AI_SET ?? "ai6";
const modules = fileURLToPath(
  new URL(set === "ai7" ? "./ai7/node_modules/" : "./node_modules/", import.meta.url),
);
const fromSet = (name) => ({ find: new RegExp(`^${name}(/.*)?$`), replacement: `${modules}${name}$1` });

export default defineConfig({
  resolve: {
    alias: ["ai", "@ai-sdk/react", "react", "react-dom"].map(fromSet),
    dedupe: ["react", "react-dom"],
  },
  oxc: { jsx: { runtime: "automatic" } },
  build: {
    outDir: `dist/${set}`,
    emptyOutDir: true,
    rollupOptions: {
      // swr (under @ai-sdk/react) marks its modules "use client", a React Server
      // Components hint that means nothing in a client bundle.
      onwarn(warning, warn) {
        if (warning.code !== "MODULE_LEVEL_DIRECTIVE") warn(warning);
      },
    },
  },
  logLevel: "warn",
});
