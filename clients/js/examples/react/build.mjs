// Bundles the React example (main.tsx, React, react-dom, the client and ackgate-client/react)
// into one ES module with esbuild. `npm run example:react` (in clients/js) writes dist/app.js
// next to index.html; tests/browser/react.mjs takes the bundle in memory, React's development
// build (StrictMode mounts each component twice there).
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));

/** The bundle: `{js}` (written to dist/app.js too when `write`); `development`: React's checks on. */
export async function bundle({ write = false, development = false } = {}) {
  const result = await esbuild.build({
    entryPoints: [here("main.tsx")],
    outfile: here("dist/app.js"),
    bundle: true,
    minify: !development,
    format: "esm",
    target: "es2022",
    jsx: "automatic",
    // This checkout's package, as its `exports` name it.
    alias: { "ackgate-client": here("../../ackgate.js"), "ackgate-client/react": here("../../react.js") },
    define: { "process.env.NODE_ENV": development ? '"development"' : '"production"' },
    write,
    logLevel: "warning",
  });
  return { js: write ? null : result.outputFiles[0].text };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await bundle({ write: true });
  console.log(`built ${here("dist/app.js")}`);
}
