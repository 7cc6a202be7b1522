// "kernel-lsp: Show Workspace Summary": the server's kernelLsp/workspaceSummary answer as quick pick items.

export const SUMMARY_REQUEST = "kernelLsp/workspaceSummary";
export const SUMMARY_TIMEOUT_MS = 10_000;
// The request takes no parameters, but pygls answers a request without `params` with nothing at all (it cannot
// read the message), so an empty object goes with it.
export const SUMMARY_PARAMS = {};

export type CompileState = "compiles" | "warnings" | "errors" | "checking" | "not checked";

/** One kernel file (kernel_lsp/server/workspace_feature.py, WorkspaceFeature.summary). */
export interface SummaryFile {
  uri: string;
  path: string;
  open?: boolean;
  kernels?: string[];
  compile?: CompileState | string;
  errors?: number;
  warnings?: number;
  resources?: string[];
  verify?: unknown;  // the code lens line (a string) or an object with a verdict and speedups; null: no run
  topHint?: string | null;
}

export interface WorkspaceSummary {
  ready?: boolean;
  files?: SummaryFile[];
  scanned?: number;
  kernelFiles?: number;
  scanSeconds?: number;
  truncated?: boolean;
  watching?: string;
  watchProblem?: string | null;
  queued?: number;
  dropped?: number;
  batches?: number;
  closedChecks?: number;
  cache?: string;
  cacheProblem?: string | null;
}

export interface SummaryItem {
  label: string;
  description: string;
  detail?: string;
  uri: string;
}

/** What to say instead of a list, or the list's title and placeholder. */
export type SummaryView =
  | { kind: "message"; level: "info" | "warning" | "error"; text: string }
  | { kind: "pick"; title: string; placeholder: string; items: SummaryItem[] };

const ICONS: Record<string, string> = {
  errors: "$(error)",
  warnings: "$(warning)",
  checking: "$(sync~spin)",
  "not checked": "$(circle-large-outline)",
  compiles: "$(check)",
};
const ORDER = ["errors", "warnings", "checking", "not checked", "compiles"];

function plural(count: number, one: string, many = `${one}s`): string {
  return `${count} ${count === 1 ? one : many}`;
}

function text(value: unknown): string | undefined {
  return typeof value === "string" && value.trim() ? value.trim() : undefined;
}

function count(value: unknown): number {
  return typeof value === "number" && Number.isFinite(value) ? value : 0;
}

/**
 * `path` relative to the workspace folder holding it (the first that does, for nested folders the innermost),
 * with forward slashes; an absolute path when no folder holds it.
 */
export function relativePath(path: string, folders: readonly string[]): string {
  const slashed = (value: string) => value.replace(/\\/g, "/");
  const file = slashed(path);
  let best = "";
  for (const folder of folders.map((f) => slashed(f).replace(/\/+$/, ""))) {
    if (folder && file.startsWith(`${folder}/`) && folder.length > best.length) {
      best = folder;
    }
  }
  return best ? file.slice(best.length + 1) : file;
}

function speedupText(speedups: unknown): string | undefined {
  if (speedups === null || typeof speedups !== "object") {
    return undefined;
  }
  const table = speedups as Record<string, unknown>;
  for (const kind of ["eager", "compile", ...Object.keys(table)]) {
    const value = table[kind];
    if (typeof value === "number" && Number.isFinite(value)) {
      return `${Number(value.toPrecision(3))}× ${kind}`;
    }
  }
  return undefined;
}

/**
 * The verification in a few words: "verified 1.84× eager", "rejected (verify-mismatch)", "verifying…", "not
 * verified: …". The server gives either the code lens line ("correct 5/5 · 1.84× eager · 0.97× compile · 3.1 ms",
 * "rejected · correct 3/5 · verify-mismatch", "not verified: …", "verifying…", "verify against ref.py") or an
 * object with a `verdict` (or `state`), `speedups` (or `speedup`) and a `summary` line.
 */
export function verifyText(verify: unknown): string | undefined {
  if (typeof verify === "string") {
    return verifyLine(verify);
  }
  if (verify === null || typeof verify !== "object") {
    return undefined;
  }
  const fields = verify as Record<string, unknown>;
  const verdict = text(fields.verdict) ?? text(fields.state);
  const summary = text(fields.summary) ?? text(fields.title);
  const speedup = speedupText(fields.speedups ?? fields.speedup);
  switch (verdict) {
    case "verified":
    case "correct":
      return speedup ? `verified ${speedup}` : "verified";
    case "rejected": {
      const reason = text(fields.reason) ?? (Array.isArray(fields.codes) ? fields.codes.join(", ") : undefined);
      return reason ? `rejected (${reason})` : summary ? verifyLine(summary) : "rejected";
    }
    case "running":
    case "verifying":
      return "verifying…";
    default:
      return summary ? verifyLine(summary) : verdict;
  }
}

function verifyLine(line: string): string | undefined {
  const trimmed = line.trim();
  if (!trimmed) {
    return undefined;
  }
  const parts = trimmed.split(" · ");
  const passed = /^correct (\d+)\/(\d+)$/.exec(parts[0]);
  if (passed && passed[1] === passed[2]) {
    if (parts.some((part) => part.startsWith("run on the CPU"))) {
      return "verified (CPU)"; // the server shows no CPU timings: they say nothing of a GPU
    }
    const speedup = parts.find((part) => /× eager/.test(part)) ?? parts.find((part) => /×/.test(part));
    return speedup ? `verified ${speedup}` : "verified";
  }
  if (parts[0] === "rejected" && parts.length > 1) {
    return `rejected (${parts[parts.length - 1]})`;
  }
  return trimmed;
}

function countsText(file: SummaryFile): string | undefined {
  const parts = [];
  if (count(file.errors)) {
    parts.push(plural(count(file.errors), "error"));
  }
  if (count(file.warnings)) {
    parts.push(plural(count(file.warnings), "warning"));
  }
  return parts.length ? parts.join(", ") : undefined;
}

/** One quick pick item: icon and relative path; state · kernels · verification; errors and the top hint. */
export function summaryItem(file: SummaryFile, folders: readonly string[]): SummaryItem {
  const state = text(file.compile) ?? "not checked";
  const kernels = Array.isArray(file.kernels) ? file.kernels.length : 0;
  const description = [state, plural(kernels, "kernel"), verifyText(file.verify)]
    .filter((part): part is string => part !== undefined).join(" · ");
  const hint = text(file.topHint);
  const detail = [countsText(file), hint].filter((part) => part !== undefined).join(" · ")
    || (state === "compiles" ? text(file.resources?.[0]) : undefined);
  const item: SummaryItem = {
    label: `${ICONS[state] ?? "$(question)"} ${relativePath(file.path, folders)}`,
    description: file.open ? `${description} · open` : description,
    uri: file.uri,
  };
  if (detail) {
    item.detail = detail;
  }
  return item;
}

/** The scan's and the background checks' state, in one line: the quick pick's placeholder. */
export function summaryHeader(summary: WorkspaceSummary): string {
  const parts = [
    `${plural(count(summary.kernelFiles), "kernel file")} of ${count(summary.scanned)} scanned` +
      (summary.truncated ? " (truncated)" : ""),
    `watching: ${text(summary.watching) ?? "off"}`,
    `${count(summary.queued)} queued`,
  ];
  if (count(summary.dropped)) {
    parts.push(`${count(summary.dropped)} dropped`);
  }
  for (const problem of [summary.watchProblem, summary.cacheProblem]) {
    if (text(problem)) {
      parts.push(text(problem) as string);
    }
  }
  return parts.join(" · ");
}

/**
 * What the command shows for the server's answer: a message when there is nothing to list (the scan still
 * running, no kernel files, an answer that is not a summary), else the items, files with errors first, then
 * warnings, files being checked, unchecked ones and those that compile, each group in the server's (path) order.
 */
export function summaryView(answer: unknown, folders: readonly string[]): SummaryView {
  if (answer === null || typeof answer !== "object" || Array.isArray(answer)) {
    return { kind: "message", level: "error", text: "kernel-lsp: the server gave no workspace summary" };
  }
  const summary = answer as WorkspaceSummary;
  const files = Array.isArray(summary.files) ? summary.files.filter((f) => f && typeof f.uri === "string") : [];
  if (!files.length) {
    if (summary.ready === false) {
      return { kind: "message", level: "info",
        text: "kernel-lsp: the workspace is still being scanned; try again in a moment" };
    }
    return { kind: "message", level: "info", text: `kernel-lsp: no kernel files in the workspace ` +
      `(${plural(count(summary.scanned), "file")} scanned)` };
  }
  const rank = (file: SummaryFile) => {
    const at = ORDER.indexOf(text(file.compile) ?? "not checked");
    return at < 0 ? ORDER.length : at;
  };
  const sorted = files.map((file, index) => ({ file, index }))
    .sort((a, b) => rank(a.file) - rank(b.file) || a.index - b.index)
    .map(({ file }) => summaryItem(file, folders));
  const header = summaryHeader(summary);
  return {
    kind: "pick",
    title: "kernel-lsp: workspace summary",
    placeholder: summary.ready === false ? `${header} · still scanning` : header,
    items: sorted,
  };
}

/** The message for a request that failed or did not answer in time. */
export function summaryFailure(error: unknown, timedOut: boolean): string {
  if (timedOut) {
    return `kernel-lsp: the server did not send the workspace summary within ${SUMMARY_TIMEOUT_MS / 1000} s ` +
      "(it may be busy scanning a large workspace); try again";
  }
  const message = error instanceof Error ? error.message : String(error);
  return `kernel-lsp: the workspace summary failed: ${message}`;
}
