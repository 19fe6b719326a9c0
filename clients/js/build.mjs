// Builds dist/ackgate.min.js and its source map: the client minified into one file, for a plain
// `<script type="module">`. `npm run build` runs it (and `npm pack` through `prepack`), and so
// does test/unit.test.mjs (into a temporary directory), which then runs the built file. dist/ is
// not committed. `node build.mjs --served` writes the copy every gateway serves at
// /static/ackgate.min.js (static/ in the repository: committed, the binary compiles it in; the
// suite checks it is the build of ackgate.js).
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));

export async function build(file = here("dist/ackgate.min.js")) {
  const { version } = (await import("./package.json", { with: { type: "json" } })).default;
  await esbuild.build({
    entryPoints: [here("ackgate.js")],
    outfile: file,
    bundle: true,
    minify: true,
    sourcemap: true,
    format: "esm",
    target: "es2022",
    banner: { js: `// ackgate-client ${version} (minified), Apache-2.0: https://github.com/ackgate/ackgate` },
    logLevel: "warning",
  });
  return { file, map: `${file}.map` };
}

/**
 * The gateway's copy in `dir`: ackgate.min.js and its map, whose source is named `ackgate.js`, the
 * unminified client the gateway serves beside it (/static/ackgate.js), with its text inside.
 */
export async function buildServed(dir = here("../../static")) {
  const built = await build(join(dir, "ackgate.min.js"));
  const map = JSON.parse(readFileSync(built.map, "utf8"));
  map.sources = ["ackgate.js"];
  writeFileSync(built.map, JSON.stringify(map));
  return built;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { file } = process.argv.includes("--served") ? await buildServed() : await build();
  console.log(`built ${file}`);
}
