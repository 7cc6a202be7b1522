// Drives code-server in Debian's headless chromium (playwright-core from the setup folder): optionally follows the
// first run's "cannot import kernel_lsp" message to the settings and sets the interpreter there; opens a .cu file,
// reads the Problems view, hovers a kernel name, lists the source actions (Ctrl+.'s on a candidate's kernel too, before
// the worker starts); optionally optimizes a candidate (reading its progress in the status bar and, after a click,
// its Cancel button) and reads VS Code's refactor preview of the result before applying it, and imports an Nsight
// Compute profile through the open dialogs and reads a kernel's hover card; lists the workspace summary's quick pick
// and opens a file from it; screenshots into the artifacts folder.
// Usage: node e2e-code-server.mjs CONFIG.json; prints one JSON object with what it saw.
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const config = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const { chromium } = createRequire(path.join(config.setupDir, "package.json"))("playwright-core");
const WAIT_MS = config.waitMs ?? 90_000;
const HOVER_TRY_MS = 10_000;  // one try at a hover: the mouse moved onto the word, the widget not shown yet
const seen = { problems: [], hover: "", actions: "", refactorActions: {}, status: "", workerStatus: "", remoteStatus: "", remoteTooltip: "",
  finalStatus: "", importProblem: null, ctrlDotCandidate: null,
  optimize: null, summary: null, profileImport: null, screenshots: [], steps: [] };

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
  const input = page.locator(".quick-input-widget input");
  // a key press can be lost, or the palette closed under us, while the workbench settles (the server restarting
  // after the key was set takes the focus once): F1 again, after Escape, until the command is chosen
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    try {
      await page.keyboard.press("F1");
      await input.waitFor({ state: "visible", timeout: 5000 });
      await input.fill(`>${command}`, { timeout: 5000 });
      await page.locator(".quick-input-widget .monaco-list-row", { hasText: command }).first()
        .waitFor({ state: "visible", timeout: 5000 });
      await page.keyboard.press("Enter");
      return;
    } catch (error) {
      if (Date.now() > deadline) {
        throw new Error(`the command palette did not run "${command}" within ${WAIT_MS} ms: ${error}`);
      }
      await page.keyboard.press("Escape");
    }
  }
}

/**
 * The "Refactor..." menu on `token` with its "Show Disabled" toggle on (VS Code lists disabled code actions there,
 * faded, with their reason as the row's tooltip; the lightbulb and Quick Fix... leave them out): each row's text,
 * whether it is disabled, and its tooltip. With `quickFix`, the menu Ctrl+. opens instead ("Quick Fix...", as it
 * comes: no toggle); [] when the menu says it has nothing.
 */
async function refactorMenu(page, token, shotName, quickFix = false) {
  const centre = await tokenCentre(page, token);
  await page.mouse.click(centre.x, centre.y);
  await palette(page, quickFix ? "Quick Fix..." : "Refactor...");
  const menu = page.locator(".action-widget").first();
  // the message VS Code shows by the cursor when the menu would be empty (e.g. a server that is still starting)
  const none = page.locator(".monaco-editor-overlaymessage",
    { hasText: quickFix ? "No code actions available" : "No refactorings available" }).first();
  const firstRow = menu.locator(".monaco-list-row").first();
  // either may show, or both for a moment (the message of the menu before fading as this one opens)
  await firstRow.or(none).first().waitFor({ state: "visible", timeout: WAIT_MS });
  if (!(await firstRow.isVisible())) {
    await firstRow.waitFor({ state: "visible", timeout: 3000 }).catch(() => undefined);
  }
  if (!(await firstRow.isVisible())) {
    await shot(page, shotName);
    await page.keyboard.press("Escape");
    return [];
  }
  await page.waitForTimeout(500);  // every provider's answer in
  const showDisabled = menu.getByText("Show Disabled");  // VS Code folds the disabled actions behind this toggle
  if (!quickFix && await showDisabled.count()) {
    await showDisabled.first().evaluate((link) => link.click());  // the menu's pointer block takes mouse clicks
    await page.waitForTimeout(300);
  }
  const rows = await menu.locator(".monaco-list-row").evaluateAll((elements) => elements.map((row) => ({
    text: row.innerText.replace(/\s+/g, " ").trim(),
    disabled: row.classList.contains("option-disabled") || row.getAttribute("aria-disabled") === "true",
    tooltip: row.getAttribute("title") || row.querySelector("[title]")?.getAttribute("title") || "",
  })));
  await shot(page, shotName);
  await page.keyboard.press("Escape");
  return rows;
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

/** openFile for a file just written: Quick Open may answer from its file list of before, so it asks again. */
async function openNewFile(page, file, token) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    await page.keyboard.press("Control+P");
    const input = page.locator(".quick-input-widget input");
    await input.waitFor({ state: "visible", timeout: WAIT_MS });
    await input.fill(file);
    const found = await page.locator(".quick-input-widget .monaco-list-row", { hasText: file }).first()
      .waitFor({ state: "visible", timeout: 5000 }).then(() => true, () => false);
    if (found) {
      await page.keyboard.press("Enter");
      await tokenCentre(page, token);
      return;
    }
    await page.keyboard.press("Escape");
    if (Date.now() > deadline) {
      throw new Error(`Quick Open did not find ${file}`);
    }
    await page.waitForTimeout(1000);
  }
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
async function optimize(page, { file, kernel, workspace, command, marker, appliedText, noKey, progressTitle }) {
  const result = { preview: "", tickedAtFirst: [], diff: "", diskDuringPreview: "", editor: "",
    diskAfterApply: "", noKey: null, progress: null };
  seen.optimize = result;
  const panel = page.locator(".bulk-edit-panel");
  const fileRow = panel.locator(".monaco-list-row", { has: page.locator(".monaco-icon-label", { hasText: file }) })
    .first();
  await step("optimize: open candidate", () => openFile(page, file, kernel));
  if (noKey) {
    result.noKey = await withoutAKey(page, file, kernel, command, noKey);
  }
  await step("optimize: refactor menu", async () => {
    const optimizeRow = (rows) => rows.find((row) => row.text.startsWith("Optimize this kernel"));
    const deadline = Date.now() + WAIT_MS;
    for (;;) {  // after the key was set the server restarts: its answer may still be the one without a key
      seen.refactorActions[file] = await refactorMenu(page, kernel, "refactor-menu-py");
      if (!noKey || optimizeRow(seen.refactorActions[file])?.disabled === false || Date.now() > deadline) {
        break;
      }
      await page.waitForTimeout(1000);
    }
  });
  await step("optimize: progress", async () => {
    await palette(page, command);
    result.progress = await progressInStatusBar(page, progressTitle, "optimize-progress");
  });
  await step("optimize: refactor preview", async () => {
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

/**
 * A server's progress titled `title`, where VS Code's language client shows it (a window progress: a silent
 * notification): a status bar entry, no toast, no Cancel button on the screen; clicking the entry opens the
 * notification center, where the progress has its Cancel button (not pressed). The center is hidden again after the
 * screenshot.
 */
async function progressInStatusBar(page, title, shotName) {
  const result = { status: "", toasts: 0, cancelBefore: 0, notification: "", buttons: [], center: [] };
  const entry = page.locator(".statusbar-item", { hasText: title }).first();
  await entry.waitFor({ state: "visible", timeout: WAIT_MS });
  result.status = (await entry.innerText()).replace(/\s+/g, " ").trim();
  result.toasts = await page.locator(".notifications-toasts .notification-list-item", { hasText: title }).count();
  result.cancelBefore = await page.locator(".monaco-button:visible", { hasText: /^Cancel$/ }).count();
  await entry.click();
  const item = page.locator(".notifications-center .notification-list-item", { hasText: title }).first();
  await item.waitFor({ state: "visible", timeout: 10_000 });
  result.notification = (await item.locator(".notification-list-item-message").innerText()).replace(/\s+/g, " ")
    .trim();
  result.buttons = (await item.locator(".monaco-button:visible").allInnerTexts()).map((text) => text.trim());
  result.center = (await page.locator(".notifications-center .notification-list-item-message").allInnerTexts())
    .map((text) => text.replace(/\s+/g, " ").trim());
  await shot(page, shotName);
  await palette(page, "Notifications: Hide Notifications");
  return result;
}

/** The text of the first notification toast holding `text`, once it shows; then the toasts are cleared. */
async function notification(page, text) {
  const toast = page.locator(".notifications-toasts .notification-list-item", { hasText: text }).first();
  await toast.waitFor({ state: "visible", timeout: WAIT_MS });
  const said = (await toast.locator(".notification-list-item-message").innerText()).replace(/\s+/g, " ").trim();
  await palette(page, "Notifications: Clear All Notifications");
  return said;
}

/**
 * The no-key path as a new user meets it: the Refactor... menu's Optimize entry disabled with its reason, the
 * Optimize command's message naming the remedy, then the remedy itself ("Set Anthropic API Key" keeps `key` in
 * VS Code's secret storage and restarts the server with it).
 */
async function withoutAKey(page, file, kernel, command, { key, keyCommand }) {
  const result = { menu: [], message: "" };
  await step("optimize without a key: refactor menu", async () => {
    const deadline = Date.now() + 60_000;  // an empty menu asked again, as in the "refactor menu" step
    result.menu = await refactorMenu(page, kernel, "refactor-menu-no-key");
    while (!result.menu.length && Date.now() < deadline) {
      await page.waitForTimeout(2000);
      result.menu = await refactorMenu(page, kernel, "refactor-menu-no-key");
    }
  });
  await step("optimize without a key: the message", async () => {
    const centre = await tokenCentre(page, kernel);
    await page.mouse.click(centre.x, centre.y);
    await palette(page, command);
    result.message = await notification(page, "no Anthropic API key");
  });
  await step("optimize without a key: set the key", async () => {
    await palette(page, keyCommand);
    const input = page.locator(".quick-input-widget input");
    await input.waitFor({ state: "visible", timeout: WAIT_MS });
    result.password = await input.getAttribute("type");
    await input.fill(key);
    await page.keyboard.press("Enter");
    await tokenCentre(page, kernel);
  });
  return result;
}

/**
 * The first run with an interpreter that cannot import kernel_lsp: the extension's error message, its Open Settings
 * button, and where that leads (the settings editor's tabs, which one is selected, the setting rows it lists); then,
 * as the user would, `pythonPath` typed into that setting's row there (its title holds `settingLabel`), waiting until
 * `written` (the settings file that tab edits) holds `settingKey`, and the settings editor closed.
 */
async function followImportProblem(page, { toastText, settingKey, settingLabel, pythonPath, written }) {
  const result = { message: "", buttons: [], tabs: [], selectedTab: "", query: "", rows: [], written: "" };
  seen.importProblem = result;
  const settings = page.locator(".settings-editor");
  const row = settings.locator(".setting-item-contents",
    { has: page.locator(".setting-item-title", { hasText: settingLabel }) }).first();
  await step("first run: cannot import kernel_lsp", async () => {
    const toast = page.locator(".notifications-toasts .notification-list-item", { hasText: toastText }).first();
    await toast.waitFor({ state: "visible", timeout: WAIT_MS });
    result.message = (await toast.locator(".notification-list-item-message").innerText()).replace(/\s+/g, " ").trim();
    result.buttons = (await toast.locator(".monaco-button").allInnerTexts()).map((text) => text.trim());
    await toast.locator(".monaco-button", { hasText: "Open Settings" }).first().click();
    await settings.waitFor({ state: "visible", timeout: WAIT_MS });
    // the settings editor fills its list after opening; a tab that does not list the setting never shows it
    await row.waitFor({ state: "visible", timeout: 15_000 }).catch(() => undefined);
    await page.waitForTimeout(500);  // the filter applied
    result.tabs = await settings.locator(".settings-tabs-widget .action-item").evaluateAll((tabs) => tabs.map(
      (tab) => ({ text: tab.textContent.replace(/\s+/g, " ").trim(), selected: [tab, ...tab.querySelectorAll("*")]
        .some((e) => e.classList.contains("checked") || e.getAttribute("aria-selected") === "true") })));
    result.selectedTab = result.tabs.filter((tab) => tab.selected).map((tab) => tab.text).join(" | ");
    result.query = await settings.locator(".settings-header .monaco-editor .view-lines").first().innerText()
      .then((text) => text.replace(/\u00a0/g, " ").trim(), () => "");
    result.rows = (await settings.locator(".setting-item-contents .setting-item-title").allInnerTexts())
      .map((text) => text.replace(/\s+/g, " ").trim());
    await shot(page, "open-settings-remote");
  });
  await step("first run: set the interpreter there", async () => {
    const input = row.locator(".setting-item-control input").first();
    await input.fill(pythonPath, { timeout: 10_000 });
    await input.press("Enter");
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      result.written = fs.existsSync(written) ? fs.readFileSync(written, "utf8") : "";
      if (result.written.includes(settingKey) || Date.now() > deadline) {
        break;
      }
      await page.waitForTimeout(250);
    }
    await palette(page, "View: Close Editor");
    await settings.waitFor({ state: "hidden", timeout: WAIT_MS });
  });
}

/** Answers code-server's simple file dialog (a quick input holding a path) whose title has `title` with `file`. */
async function answerFileDialog(page, title, file) {
  const widget = page.locator(".quick-input-widget", { hasText: title });
  await widget.waitFor({ state: "visible", timeout: WAIT_MS });
  const input = widget.locator(".quick-input-box input");
  // the dialog writes its starting folder into the box once it has read it: a path typed before is overwritten
  await page.waitForFunction(() => document.querySelector(".quick-input-widget .quick-input-box input")
    ?.value.endsWith("/"), null, { timeout: WAIT_MS });
  for (let attempt = 0; attempt < 5; attempt++) {
    await input.fill(file);
    await page.waitForTimeout(500);  // the dialog reads the typed folder before it accepts the path
    if (await input.inputValue() === file) {
      await input.press("Enter");
    }
    const closed = await widget.waitFor({ state: "hidden", timeout: 5000 }).then(() => true, () => false);
    if (closed) {
      return;
    }
  }
  throw new Error(`the file dialog "${title}" did not take ${file}`);
}

/**
 * "Import Nsight Compute Profile…": copies the recorded files (`copy`) into the workspace folder `into`, opens `file`,
 * answers the command's two open dialogs (the details page, then the raw page), reads the
 * notification it ends with, then hovers `kernel` in `file` until the hover holds its profile card.
 */
async function importProfile(page, { command, copy, into, details, raw, file, kernel, cardText }) {
  const result = { message: "", hover: "" };
  seen.profileImport = result;
  await step("import profile: dialogs", async () => {
    fs.mkdirSync(into, { recursive: true });  // the recorded files arrive in the workspace now, not before
    for (const source of copy) {
      fs.copyFileSync(source, path.join(into, path.basename(source)));
    }
    await openNewFile(page, file, kernel);
    await palette(page, command);
    await answerFileDialog(page, "details page", details);
    await answerFileDialog(page, "raw page", raw);
    const toast = page.locator(".notification-toast", { hasText: "profile imported" }).first();
    await toast.waitFor({ state: "visible", timeout: WAIT_MS });
    result.message = (await toast.innerText()).replace(/\s+/g, " ").trim();
    await shot(page, "import-profile");
    await page.keyboard.press("Escape");
    await page.locator(".notifications-toasts .notification-toast").first().waitFor({ state: "hidden", timeout: 5000 })
      .catch(() => undefined);
  });
  await step("import profile: hover card", async () => {
    // room for the card, as a user makes it: the panel hidden, the hover (below the line: editor.hover.above is
    // off) dragged taller by its bottom edge, then scrolled past the hint diagnostics on the kernel's name
    await page.setViewportSize({ width: 1400, height: 1150 });  // the last step: a taller window for the card
    await palette(page, "View: Hide Panel");
    await page.locator(".part.panel").waitFor({ state: "hidden", timeout: WAIT_MS }).catch(() => undefined);
    const hover = page.locator(".monaco-resizable-hover", { hasText: kernel }).first();
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      const centre = await tokenCentre(page, kernel);
      await page.mouse.move(centre.x - 300, centre.y - 40);  // away first: a hover shown before is dropped
      await page.waitForTimeout(300);
      await page.mouse.move(centre.x, centre.y, { steps: 5 });
      // a hover that does not come (the window was still laying itself out after the resize, say) is asked again
      // by moving away and back, as a user would, until the deadline
      const shown = await hover.waitFor({ state: "visible", timeout: HOVER_TRY_MS }).then(() => true, (error) => {
        if (Date.now() > deadline) {
          throw error;
        }
        return false;
      });
      if (!shown) {
        result.hoverRetries = (result.hoverRetries ?? 0) + 1;
        continue;
      }
      await page.waitForTimeout(1000);  // the card's markdown (and its chart) rendered
      result.hover = (await hover.innerText()).trim();
      if (result.hover.includes(cardText) || Date.now() > deadline) {
        break;
      }
    }
    const viewport = page.viewportSize();
    const sash = hover.locator(".monaco-sash.horizontal:not(.disabled)").last();
    const edge = await sash.boundingBox().catch(() => null);
    if (edge && viewport) {
      await page.mouse.move(edge.x + edge.width / 2, edge.y + 60, { steps: 5 });  // over the hover: it stays
      await page.mouse.move(edge.x + edge.width / 2, edge.y + edge.height / 2, { steps: 5 });
      await page.mouse.down();
      await page.mouse.move(edge.x + edge.width / 2, viewport.height - 40, { steps: 10 });
      await page.mouse.up();
    }
    const title = hover.locator("p", { hasText: new RegExp(`^${kernel} · `) }).first();
    const box = await hover.boundingBox();
    result.cardTitleFound = (await title.count()) > 0;
    if (box && result.cardTitleFound) {
      await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2, { steps: 3 });
      let last = Infinity;
      for (let turn = 0; turn < 60; turn++) {  // the wheel, a notch at a time, until the card's title is on top
        const titleBox = await title.boundingBox();
        const left = titleBox ? titleBox.y - box.y - 6 : 0;
        if (left <= 0 || left >= last) {
          break;
        }
        last = left;
        await page.mouse.wheel(0, Math.min(left, 40));
        await page.waitForTimeout(300);  // the scroll settled before the next look
      }
    }
    result.hoverBox = await hover.boundingBox();
    await shot(page, "hover-profile");
  });
}

/** The rows of the open quick pick: label, description and detail, and the codicons of the label. */
async function quickPickRows(page) {
  return page.locator(".quick-input-widget .quick-input-list .monaco-list-row").evaluateAll((rows) => rows.map(
    (row) => {
      const text = (selector) => (row.querySelector(selector)?.textContent ?? "").replace(/\s+/g, " ").trim();
      return {
        label: text(".quick-input-list-label .label-name"),
        description: text(".quick-input-list-label .label-description"),
        detail: text(".quick-input-list-label-meta"),
        icons: [...row.querySelectorAll(".quick-input-list-label .codicon")].flatMap((icon) => [...icon.classList]
          .filter((name) => name.startsWith("codicon-") && name !== "codicon-modifier-spin")),
      };
    }));
}

/**
 * "Show Workspace Summary": reads the quick pick (its placeholder and rows) once it lists `file`, asking again while
 * a row still says `checking` or `verifying…`, or a row named in `until` (label -> text) lacks that text in its
 * description (for at most `settleMs`); keeps a screenshot, then types `file` into the quick pick and picks it: its
 * editor must become the active one.
 */
async function workspaceSummary(page, { command, file, until = {}, settleMs = 30_000 }) {
  const result = { placeholder: "", title: "", rows: [], attempts: 0, opened: "" };
  seen.summary = result;
  const widget = page.locator(".quick-input-widget");
  await step("workspace summary: quick pick", async () => {
    await palette(page, "Notifications: Clear All Notifications");  // the earlier steps' toasts, off the screenshot
    const deadline = Date.now() + settleMs;
    for (;;) {
      result.attempts += 1;
      await palette(page, command);
      await widget.locator(".monaco-list-row", { hasText: file }).first().waitFor({ state: "visible", timeout: WAIT_MS });
      await page.waitForTimeout(300);  // every row rendered
      result.placeholder = await widget.locator(".quick-input-box input").getAttribute("placeholder") ?? "";
      result.title = (await widget.locator(".quick-input-title").innerText().catch(() => "")).trim();
      result.rows = await quickPickRows(page);
      const busy = result.rows.some((row) => /checking|verifying/.test(row.description))
        || Object.entries(until).some(([label, text]) => !result.rows.some((row) => row.label === label
          && row.description.includes(text)));
      if (!busy || Date.now() > deadline) {
        break;
      }
      await page.keyboard.press("Escape");
      await page.waitForTimeout(1000);
    }
    await page.mouse.move(700, 760);  // off the quick pick, where its tooltip would cover the title
    await page.waitForTimeout(1000);  // the editor's code lens catches up with the verification the list shows
    await shot(page, "workspace-summary");
  });
  await step("workspace summary: open a file", async () => {
    await widget.locator(".quick-input-box input").fill(file);
    await widget.locator(".monaco-list-row", { hasText: file }).first().waitFor({ state: "visible", timeout: WAIT_MS });
    await page.keyboard.press("Enter");
    const tab = page.locator(".tabs-container .tab.active", { hasText: file }).first();
    await tab.waitFor({ state: "visible", timeout: WAIT_MS });
    result.opened = (await tab.innerText()).replace(/\s+/g, " ").trim();
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
  if (config.importProblem) {
    await followImportProblem(page, config.importProblem);
  }
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
    await palette(page, "Quick Fix...");  // what Ctrl+. opens: quick fixes and refactorings, Profile and Optimize
    const menu = page.locator(".action-widget", { hasText: config.actionText }).first();
    await menu.waitFor({ state: "visible", timeout: WAIT_MS });
    seen.actions = (await menu.innerText()).trim();
    await shot(page, "code-actions");
    await page.keyboard.press("Escape");
  });
  await step("refactor menu", async () => {
    // a server busy with the file's first compile may answer "No refactorings available" once (seen on a loaded
    // 2-core machine): asked again, as a user would, until the deadline
    const deadline = Date.now() + 60_000;
    let rows = await refactorMenu(page, config.kernel, "refactor-menu-cu");
    while (!rows.length && Date.now() < deadline) {
      await page.waitForTimeout(2000);
      rows = await refactorMenu(page, config.kernel, "refactor-menu-cu");
    }
    seen.refactorActions[config.file] = rows;
  });
  if (config.workerCommand) {
    await step("worker status", async () => {
      if (config.workerFile) {  // the command acts on this file (a .cu's profile needs no worker: the server's own)
        await openFile(page, config.workerFile, config.workerToken);
        // Ctrl+. on its kernel before any worker started: what it lists, and the worker's state at that moment
        const worker = page.locator(".statusbar-item", { hasText: "worker" }).first();
        const status = (await worker.innerText()).trim();
        const rows = await refactorMenu(page, config.workerToken, "code-actions-py", true);
        seen.ctrlDotCandidate = { status, rows, statusAfter: (await worker.innerText()).trim() };
      }
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
  if (config.summary) {
    await workspaceSummary(page, config.summary);
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
  if (config.profileImport) {
    await importProfile(page, config.profileImport);
  }
  await step("final status bar", async () => {
    const item = page.locator(".statusbar-item", { hasText: /worker:|: idle|: busy/ }).first();
    seen.finalStatus = (await item.innerText({ timeout: WAIT_MS })).trim();
  });
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
