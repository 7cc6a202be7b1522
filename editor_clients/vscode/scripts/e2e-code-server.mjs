// Drives code-server in Debian's headless chromium (playwright-core from the setup folder): opens a .cu file,
// reads the Problems view, hovers a kernel name, lists the source actions; optionally optimizes a candidate and
// reads VS Code's refactor preview of the result before applying it; screenshots into the artifacts folder.
// Usage: node e2e-code-server.mjs CONFIG.json; prints one JSON object with what it saw.
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const config = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const { chromium } = createRequire(path.join(config.setupDir, "package.json"))("playwright-core");
const WAIT_MS = config.waitMs ?? 90_000;
const seen = { problems: [], hover: "", actions: "", status: "", workerStatus: "", remoteStatus: "", remoteTooltip: "",
  optimize: null, screenshots: [], steps: [] };

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

/** Opens a workspace file with Quick Open and waits for `token` in its editor. */
async function openFile(page, file, token) {
  await page.keyboard.press("Control+P");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor({ state: "visible", timeout: WAIT_MS });
  await input.fill(file);
  await page.locator(".quick-input-widget .monaco-list-row", { hasText: file }).first()
    .waitFor({ state: "visible", timeout: WAIT_MS });
  await page.keyboard.press("Enter");
  await tokenCentre(page, token);
}

/** The text of an editor's visible lines (Monaco renders spaces as no-break spaces). */
async function visibleText(editor) {
  const lines = await editor.locator(".view-lines .view-line").allInnerTexts();
  return lines.map((line) => line.replace(/\u00a0/g, " ")).join("\n");
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

/**
 * "Optimize This Kernel" on a candidate: the result comes as a workspace edit that needs confirmation, so VS Code
 * opens the Refactor Preview panel with the change unticked (VS Code's rule for such edits). Reads the panel, ticks
 * the change, reads the diff it opens (the file on disk still unchanged), applies it with the panel's Apply button
 * and reads the editor and the file (which VS Code saves after a refactoring).
 */
async function optimize(page, { file, kernel, workspace, command, marker, appliedText }) {
  const result = { preview: "", tickedAtFirst: [], diff: "", diskDuringPreview: "", editor: "",
    diskAfterApply: "" };
  seen.optimize = result;
  const panel = page.locator(".bulk-edit-panel");
  const fileRow = panel.locator(".monaco-list-row", { has: page.locator(".monaco-icon-label", { hasText: file }) })
    .first();
  await step("optimize: open candidate", () => openFile(page, file, kernel));
  await step("optimize: refactor preview", async () => {
    await palette(page, command);
    // the agent pass: the fake model's turns, then verification on the CPU worker under TRITON_INTERPRET=1
    await page.locator('.bulk-edit-panel[data-state="data"] .monaco-list-row').first()
      .waitFor({ state: "visible", timeout: WAIT_MS * 3 });
    await fileRow.waitFor({ state: "visible", timeout: WAIT_MS });
    result.preview = (await panel.locator(".monaco-list-row").allInnerTexts())
      .map((text) => text.replace(/\s+/g, " ").trim()).join("\n");
    result.tickedAtFirst = await panel.locator("input.edit-checkbox")
      .evaluateAll((boxes) => boxes.map((box) => box.checked));
    await shot(page, "optimize-panel");
  });
  await step("optimize: preview diff", async () => {
    await fileRow.locator("input.edit-checkbox").check();  // the file's box ticks its edits
    await fileRow.click({ position: { x: 200, y: 10 } });  // its entry opens the refactor preview's diff
    const diff = page.locator(".monaco-diff-editor", { hasText: marker }).first();
    await diff.waitFor({ state: "visible", timeout: WAIT_MS });
    result.diskDuringPreview = fs.readFileSync(path.join(workspace, file), "utf8");
    result.diff = await visibleText(diff.locator(".editor.modified"));
    await shot(page, "optimize-preview");
  });
  await step("optimize: apply", async () => {
    await panel.locator(".content .buttons .monaco-button", { hasText: "Apply" }).first().click();
    await page.locator('.bulk-edit-panel[data-state="data"]').waitFor({ state: "hidden", timeout: WAIT_MS })
      .catch(() => undefined);  // the panel may close, or show its "no changes" message
    const tab = page.locator(".tabs-container .tab", { hasText: file }).first();
    await tab.click();
    const editor = page.locator(".editor-instance .monaco-editor", { hasText: appliedText }).first();
    await editor.waitFor({ state: "visible", timeout: WAIT_MS });
    result.editor = await visibleText(editor);
    // VS Code saves the files of an applied refactoring (files.refactoring.autoSave, on by default)
    const deadline = Date.now() + 15_000;
    for (;;) {
      result.diskAfterApply = fs.readFileSync(path.join(workspace, file), "utf8");
      if (result.diskAfterApply.includes(appliedText) || Date.now() > deadline) {
        break;
      }
      await page.waitForTimeout(250);
    }
    await shot(page, "optimize-applied");
  });
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
  await step("open file", () => openFile(page, config.file, config.kernel));
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
  if (config.optimize) {
    await optimize(page, config.optimize);
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
