// Headless Chromium for the browser tests: one page, and the problems seen on it (page errors,
// and any request to somewhere other than the given bases: nothing may load from the internet).
import { chromium } from "playwright-core";

export async function openPage(...bases) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const problems = [];
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("request", (r) => !bases.some((base) => r.url().startsWith(base)) && problems.push(`request outside ${bases.join(" and ")}: ${r.url()}`));
  return { browser, page, problems };
}
