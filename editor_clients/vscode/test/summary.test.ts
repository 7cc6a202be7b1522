import assert from "node:assert/strict";
import { test } from "node:test";

import { SummaryFile, WorkspaceSummary, relativePath, summaryFailure, summaryHeader, summaryItem, summaryView,
  verifyText } from "../src/pure/summary";

const FOLDERS = ["/work/proj"];

function file(name: string, changes: Partial<SummaryFile> = {}): SummaryFile {
  return { uri: `file:///work/proj/${name}`, path: `/work/proj/${name}`, open: false, kernels: ["k"],
    compile: "compiles", errors: 0, warnings: 0, resources: [], verify: null, topHint: null, ...changes };
}

function summary(files: SummaryFile[], changes: Partial<WorkspaceSummary> = {}): WorkspaceSummary {
  return { ready: true, files, scanned: 12, kernelFiles: files.length, scanSeconds: 0.04, truncated: false,
    watching: "client", watchProblem: null, queued: 0, dropped: 0, batches: 0, closedChecks: 1, cache: "off",
    cacheProblem: null, ...changes };
}

test("paths relative to the workspace folder that holds them", () => {
  assert.equal(relativePath("/work/proj/kernels/a.cu", FOLDERS), "kernels/a.cu");
  assert.equal(relativePath("/work/proj/kernels/a.cu", ["/work", "/work/proj/"]), "kernels/a.cu");  // innermost
  assert.equal(relativePath("/work/projects/a.cu", FOLDERS), "/work/projects/a.cu");  // not a prefix by name
  assert.equal(relativePath("C:\\w\\src\\a.cu", ["C:\\w"]), "src/a.cu");
  assert.equal(relativePath("/elsewhere/a.cu", []), "/elsewhere/a.cu");
});

test("the verification in a few words, from the code lens line", () => {
  assert.equal(verifyText("correct 5/5 · 1.84× eager · 0.97× compile · 3.1 ms"), "verified 1.84× eager");
  assert.equal(verifyText("correct 2/2 · run on the CPU: timings not comparable"), "verified (CPU)");
  assert.equal(verifyText("correct 5/5 · 31.2 µs"), "verified");
  assert.equal(verifyText("rejected · correct 3/5 · verify-mismatch"), "rejected (verify-mismatch)");
  assert.equal(verifyText("not verified: the GPU worker is unavailable"), "not verified: the GPU worker is unavailable");
  assert.equal(verifyText("verifying…"), "verifying…");
  assert.equal(verifyText("verify against ref.py"), "verify against ref.py");
  assert.equal(verifyText(""), undefined);
  assert.equal(verifyText(null), undefined);
  assert.equal(verifyText(undefined), undefined);
});

test("the verification in a few words, from an object", () => {
  assert.equal(verifyText({ verdict: "verified", speedups: { compile: 0.97, eager: 1.8412 } }), "verified 1.84× eager");
  assert.equal(verifyText({ verdict: "verified", speedup: { compile: 2 } }), "verified 2× compile");
  assert.equal(verifyText({ verdict: "verified", speedups: {} }), "verified");
  assert.equal(verifyText({ verdict: "rejected", reason: "verify-mismatch" }), "rejected (verify-mismatch)");
  assert.equal(verifyText({ verdict: "rejected", summary: "rejected · correct 0/5 · verify-nan" }),
    "rejected (verify-nan)");
  assert.equal(verifyText({ state: "running" }), "verifying…");
  assert.equal(verifyText({ verdict: "unavailable", summary: "not verified: no worker" }), "not verified: no worker");
  assert.equal(verifyText({ summary: "correct 5/5 · 1.2× eager" }), "verified 1.2× eager");
  assert.equal(verifyText({}), undefined);
});

test("an item: icon and path; state, kernels and verification; errors and the top hint", () => {
  const broken = summaryItem(file("broken.cu", { kernels: ["scale_kernel", "broken_kernel"], compile: "errors",
    errors: 1, open: true }), FOLDERS);
  assert.deepEqual(broken, { label: "$(error) broken.cu", description: "errors · 2 kernels · open",
    detail: "1 error", uri: "file:///work/proj/broken.cu" });
  const fast = summaryItem(file("relu.py", { verify: "correct 5/5 · 1.84× eager · 0.97× compile · 3.1 ms",
    topHint: "ncu-UncoalescedGlobalAccess: uncoalesced global accesses", warnings: 2, compile: "warnings" }), FOLDERS);
  assert.equal(fast.label, "$(warning) relu.py");
  assert.equal(fast.description, "warnings · 1 kernel · verified 1.84× eager");
  assert.equal(fast.detail, "2 warnings · ncu-UncoalescedGlobalAccess: uncoalesced global accesses");
  const plain = summaryItem(file("sub/ok.cu", { resources: ["ptxas sm_90: 12 registers, 0 B smem"] }), FOLDERS);
  assert.deepEqual(plain, { label: "$(check) sub/ok.cu", description: "compiles · 1 kernel",
    detail: "ptxas sm_90: 12 registers, 0 B smem", uri: "file:///work/proj/sub/ok.cu" });
  assert.equal(summaryItem(file("a.cu", { compile: "checking", kernels: [] }), FOLDERS).label, "$(sync~spin) a.cu");
  assert.equal(summaryItem(file("a.cu", { compile: "checking", kernels: [] }), FOLDERS).description,
    "checking · 0 kernels");
  assert.equal(summaryItem(file("a.cu", { compile: "not checked" }), FOLDERS).label, "$(circle-large-outline) a.cu");
  assert.equal(summaryItem(file("a.cu", { compile: "something new" }), FOLDERS).label, "$(question) a.cu");
  assert.equal(summaryItem(file("a.cu", { compile: undefined }), FOLDERS).description, "not checked · 1 kernel");
});

test("the header: kernel files, files scanned, watching, queue; problems when there are any", () => {
  assert.equal(summaryHeader(summary([file("a.cu")])), "1 kernel file of 12 scanned · watching: client · 0 queued");
  assert.equal(summaryHeader(summary([], { kernelFiles: 3, truncated: true, watching: "off", queued: 5, dropped: 2,
    watchProblem: "the client does not offer workspace/didChangeWatchedFiles", cacheProblem: "damaged cache" })),
  "3 kernel files of 12 scanned (truncated) · watching: off · 5 queued · 2 dropped · " +
    "the client does not offer workspace/didChangeWatchedFiles · damaged cache");
  assert.equal(summaryHeader({}), "0 kernel files of 0 scanned · watching: off · 0 queued");
});

test("the view: errors first, then warnings, checking, unchecked, compiling; each in the server's order", () => {
  const view = summaryView(summary([file("a.cu"), file("b.cu", { compile: "errors", errors: 2 }),
    file("c.cu", { compile: "not checked" }), file("d.cu", { compile: "warnings", warnings: 1 }),
    file("e.cu", { compile: "errors", errors: 1 }), file("f.cu", { compile: "checking" })]), FOLDERS);
  assert.equal(view.kind, "pick");
  if (view.kind === "pick") {
    assert.deepEqual(view.items.map((item) => item.label), ["$(error) b.cu", "$(error) e.cu", "$(warning) d.cu",
      "$(sync~spin) f.cu", "$(circle-large-outline) c.cu", "$(check) a.cu"]);
    assert.equal(view.title, "kernel-lsp: workspace summary");
    assert.equal(view.placeholder, "6 kernel files of 12 scanned · watching: client · 0 queued");
  }
});

test("nothing to list: still scanning, no kernel files, or no summary at all", () => {
  assert.deepEqual(summaryView(summary([], { ready: false, scanned: 0 }), FOLDERS), { kind: "message",
    level: "info", text: "kernel-lsp: the workspace is still being scanned; try again in a moment" });
  assert.deepEqual(summaryView(summary([], { scanned: 40 }), FOLDERS), { kind: "message", level: "info",
    text: "kernel-lsp: no kernel files in the workspace (40 files scanned)" });
  for (const answer of [null, undefined, "x", [], 3]) {
    const view = summaryView(answer, FOLDERS);
    assert.equal(view.kind, "message");
    assert.equal(view.kind === "message" && view.level, "error");
  }
  const early = summaryView(summary([file("a.cu")], { ready: false }), FOLDERS);
  assert.equal(early.kind === "pick" && early.placeholder.endsWith(" · still scanning"), true);
  const odd = summaryView({ files: [{ path: "/x.cu" }, file("a.cu")] }, FOLDERS);  // an entry without a URI
  assert.equal(odd.kind === "pick" && odd.items.length, 1);
});

test("a failed or unanswered request says so", () => {
  assert.match(summaryFailure(undefined, true), /did not send the workspace summary within 10 s/);
  assert.equal(summaryFailure(new Error("Unhandled method kernelLsp/workspaceSummary"), false),
    "kernel-lsp: the workspace summary failed: Unhandled method kernelLsp/workspaceSummary");
});
