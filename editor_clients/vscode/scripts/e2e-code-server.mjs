// Drives code-server in Debian's headless chromium (playwright-core from the setup folder): opens a .cu file,
// reads the Problems view, hovers a kernel name, lists the source actions; screenshots into the artifacts folder.
// Usage: node e2e-code-server.mjs CONFIG.json; prints one JSON object with what it saw.
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const config = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const { chromium } = createRequire(path.join(config.setupDir, "package.json"))("playwright-core");
const WAIT_MS = config.waitMs ?? 90_000;
const seen = { problems: [], hover: "", actions: "", status: "", workerStatus: "", remoteStatus: "", remoteTooltip: "", screenshots: [], steps: [] };

async function shot(page, name) {
  const file = path.join(config.artifacts, `${name}.png`);
  await page.screenshot({ path: file });
  seen.screenshots.push(file);
}

async function step(name, body) {
  const started = Date.now();
  try {
    await body();
    seen.steps.push(`${name}: ok (${Date.now() - started} ms)`);
  } catch (error) {
    seen.steps.push(`${name}: ${String(error).split("\n")[0]}`);
    throw error;
  }
}

/** Runs a workbench command through the command palette. */
async function palette(page, command) {
  await page.keyboard.press("F1");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor({ state: "visible", timeout: WAIT_MS });
  await input.fill(`>${command}`);
  await page.locator(".quick-input-widget .monaco-list-row", { hasText: command }).first()
    .waitFor({ state: "visible", timeout: WAIT_MS });
  await page.keyboard.press("Enter");
}

/** The centre of the editor's token whose text is exactly `word`. */
async function tokenCentre(page, word) {
  const handle = await page.waitForFunction((text) => {
    const spans = [...document.querySelectorAll(".monaco-editor .view-lines .view-line span span")];
    const span = spans.find((s) => s.textContent === text);
    if (!span) {
      return null;
    }
    const box = span.getBoundingClientRect();
    return { x: box.left + box.width / 2, y: box.top + box.height / 2 };
  }, word, { timeout: WAIT_MS });
  return handle.jsonValue();
}

const browser = await chromium.launch({ executablePath: config.chromium, headless: true,
  args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"] });
let failure = null;
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  await step("open workbench", async () => {
    await page.goto(`${config.url}/?folder=${encodeURIComponent(config.workspace)}`);
    await page.locator(".monaco-workbench").waitFor({ timeout: WAIT_MS });
  });
  await step("open file", async () => {
    await page.keyboard.press("Control+P");
    const input = page.locator(".quick-input-widget input");
    await input.waitFor({ state: "visible", timeout: WAIT_MS });
    await input.fill(config.file);
    await page.locator(".quick-input-widget .monaco-list-row", { hasText: config.file }).first()
      .waitFor({ state: "visible", timeout: WAIT_MS });
    await page.keyboard.press("Enter");
    await tokenCentre(page, config.kernel);
  });
  await step("problems", async () => {
    await palette(page, "View: Focus Problems");
    const row = page.locator(".markers-panel .monaco-list-row", { hasText: config.errorText }).first();
    await row.waitFor({ state: "visible", timeout: WAIT_MS });
    seen.problems = (await page.locator(".markers-panel .monaco-list-row").allInnerTexts())
      .map((text) => text.replace(/\s+/g, " ").trim());
    await shot(page, "problems");
  });
  await step("status bar", async () => {
    const item = page.locator(".statusbar-item", { hasText: "worker:" }).first();
    await item.waitFor({ state: "visible", timeout: WAIT_MS });
    seen.status = (await item.innerText()).trim();
  });
  await step("hover", async () => {
    const centre = await tokenCentre(page, config.kernel);
    await page.mouse.move(centre.x - 30, centre.y + 40);
    await page.mouse.move(centre.x, centre.y, { steps: 5 });
    const hover = page.locator(".monaco-hover", { hasText: config.kernel }).first();
    await hover.waitFor({ state: "visible", timeout: WAIT_MS });
    seen.hover = (await hover.innerText()).trim();
    await shot(page, "hover");
  });
  await step("code actions", async () => {
    const centre = await tokenCentre(page, config.kernel);
    await page.mouse.click(centre.x, centre.y);
    await palette(page, "Source Action...");
    const menu = page.locator(".action-widget", { hasText: config.actionText }).first();
    await menu.waitFor({ state: "visible", timeout: WAIT_MS });
    seen.actions = (await menu.innerText()).trim();
    await shot(page, "code-actions");
    await page.keyboard.press("Escape");
  });
  if (config.workerCommand) {
    await step("worker status", async () => {
      await palette(page, config.workerCommand);
      const item = page.locator(".statusbar-item", { hasText: /: (idle|busy)|disconnected/ }).first();
      await item.waitFor({ state: "visible", timeout: WAIT_MS * 2 });
      seen.workerStatus = (await item.innerText()).trim();
      await shot(page, "worker-status");
    });
  }
  if (config.remoteAddress) {
    await step("connect to a remote worker", async () => {
      await palette(page, "kernel-lsp: Connect to a Remote Worker");
      const input = page.locator(".quick-input-widget input");
      await input.waitFor({ state: "visible", timeout: WAIT_MS });
      await input.fill(config.remoteAddress);
      await page.keyboard.press("Enter");
      await page.locator(".quick-input-widget .monaco-list-row").first().waitFor({ state: "visible", timeout: WAIT_MS });
      await page.keyboard.press("Enter");  // the token: $KERNEL_LSP_TOKEN
      const item = page.locator(".statusbar-item", { hasText: "worker: disconnected" }).first();
      await item.waitFor({ state: "visible", timeout: WAIT_MS });
      seen.remoteStatus = (await item.innerText()).trim();
      const tooltip = await item.locator("a, .statusbar-item-label").first().getAttribute("aria-label");
      seen.remoteTooltip = tooltip ?? "";
      await shot(page, "remote-worker");
    });
  }
} catch (error) {
  failure = String(error);
  const pages = browser.contexts().flatMap((c) => c.pages());
  if (pages[0]) {
    await shot(pages[0], "failure").catch(() => undefined);
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify({ ...seen, failure }));
