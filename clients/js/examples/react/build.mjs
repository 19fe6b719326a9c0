// Bundles the React example (main.tsx, React, react-dom and the client) into one ES module with
// esbuild. `npm run example:react` (in clients/js) writes dist/app.js next to index.html;
// tests/browser/react.mjs takes the bundle in memory.
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));

/** The bundle: `{js}` (written to dist/app.js too when `write`). */
export async function bundle({ write = false } = {}) {
  const result = await esbuild.build({
    entryPoints: [here("main.tsx")],
    outfile: here("dist/app.js"),
    bundle: true,
    minify: true,
    format: "esm",
    target: "es2022",
    jsx: "automatic",
    alias: { "ackgate-client": here("../../ackgate.js") }, // this checkout's client, as the package would be
    define: { "process.env.NODE_ENV": '"production"' },
    write,
    logLevel: "warning",
  });
  return { js: write ? null : result.outputFiles[0].text };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await bundle({ write: true });
  console.log(`built ${here("dist/app.js")}`);
}
