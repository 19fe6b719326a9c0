// Builds dist/ackgate.min.js and its source map: the client minified into one file, for a plain
// `<script type="module">`. `npm run build` runs it (and `npm pack` through `prepack`), and so
// does test/unit.test.mjs (into a temporary directory), which then runs the built file. dist/ is
// not committed.
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

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { file } = await build();
  console.log(`built ${file}`);
}
