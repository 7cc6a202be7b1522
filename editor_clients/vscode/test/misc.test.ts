import assert from "node:assert/strict";
import { test } from "node:test";

import { ensureEditCapabilities } from "../src/pure/capabilities";
import { IMPORT_PROFILE_COMMAND, commandEndedMessage, givenProfileFiles, importProfileArguments } from "../src/pure/commands";
import { outcomeMessage } from "../src/pure/outcome";
import { workerAddressProblem } from "../src/pure/workerAddress";

test("worker addresses as the server accepts them", () => {
  for (const ok of ["", "  ", "tcp:127.0.0.1:7777", "tcp:[::1]:7777", "tcp:gpu-host:1", "unix:/tmp/w.sock"]) {
    assert.equal(workerAddressProblem(ok), undefined, ok);
  }
  for (const bad of ["127.0.0.1:7777", "tcp:7777", "tcp:host:", "tcp:host:99999", "unix:", "http://x"]) {
    assert.notEqual(workerAddressProblem(bad), undefined, bad);
  }
});

test("change annotations and work done progress are advertised; existing capabilities are kept", () => {
  const filled = ensureEditCapabilities({});
  assert.equal(filled.workspace?.workspaceEdit?.documentChanges, true);
  assert.deepEqual(filled.workspace?.workspaceEdit?.changeAnnotationSupport, { groupsOnLabel: true });
  assert.equal(filled.window?.workDoneProgress, true);
  const kept = ensureEditCapabilities({ workspace: { workspaceEdit: { changeAnnotationSupport: { groupsOnLabel: false },
    normalizesLineEndings: true } } });
  assert.deepEqual(kept.workspace?.workspaceEdit?.changeAnnotationSupport, { groupsOnLabel: false });
  assert.equal(kept.workspace?.workspaceEdit?.normalizesLineEndings, true);
});

test("command outcomes: said once, not again where the server said it", () => {
  assert.deepEqual(outcomeMessage("kernel-lsp.verify", { status: "ok", verdict: "verified",
    summary: "correct, 1.8x eager" }), { level: "info", text: "kernel-lsp: verified: correct, 1.8x eager" });
  assert.deepEqual(outcomeMessage("kernel-lsp.verify", { status: "ok", verdict: "unavailable",
    summary: "not verified: needs a GPU" }), { level: "warning", text: "kernel-lsp: not verified: needs a GPU" });
  assert.deepEqual(outcomeMessage("kernel-lsp.verify", { status: "ok", verdict: "rejected",
    summary: "rejected · correct 3/5 · verify-mismatch" }),
  { level: "warning", text: "kernel-lsp: rejected · correct 3/5 · verify-mismatch" });
  assert.equal(outcomeMessage("kernel-lsp.verify", { status: "not-a-candidate", message: "x" }), undefined);
  assert.equal(outcomeMessage("kernel-lsp.verify", { status: "cancelled" }), undefined);
  assert.equal(outcomeMessage("kernel-lsp.profile", { status: "unavailable", message: "no worker" }), undefined);
  assert.equal(outcomeMessage("kernel-lsp.profile", { status: "not-profiled", message: "static only", problems: [] })
    ?.level, "info");
  assert.equal(outcomeMessage("kernel-lsp.profile", { status: "not-profiled", message: "no kernel profiled: x",
    problems: ["x"] }), undefined);
  assert.equal(outcomeMessage("kernel-lsp.sanitize", { status: "unavailable", message: "needs a GPU" }), undefined);
  assert.equal(outcomeMessage("kernel-lsp.sanitize", { status: "ok", summary: "clean", clean: true })?.level, "info");
  assert.equal(outcomeMessage("kernel-lsp.optimize", { uri: "file:///a.py", status: "error", message: "no key" }),
    undefined);
  assert.equal(outcomeMessage("kernel-lsp.optimize", { status: "started", uri: "file:///a.py" })?.level, "info");
  assert.deepEqual(outcomeMessage("kernel-lsp.profile", { status: "error", message: "cannot profile x" }),
    { level: "error", text: "kernel-lsp: cannot profile x" });
  assert.equal(outcomeMessage("kernel-lsp.verify", undefined), undefined);
});

test("import outcomes: the summary said once, problems beside it, an empty import a warning", () => {
  const summary = "2 kernels (import-csv on NVIDIA H200): vec_add memory bound 58.9 µs; tiny_grid latency bound 2.3 µs";
  assert.deepEqual(outcomeMessage("kernel-lsp.importProfile", { status: "ok", kernels: ["vec_add", "tiny_grid"],
    problems: [], summary }),
  { level: "info", text: `kernel-lsp: profile imported: ${summary}; hover a kernel name for its card` });
  const noRaw = outcomeMessage("kernel-lsp.importProfile", { status: "ok", kernels: ["vec_add"], summary,
    problems: ["no roofline ceilings: import the raw page too"] });
  assert.equal(noRaw?.level, "info");
  assert.match(noRaw?.text ?? "", /\(no roofline ceilings: import the raw page too\); hover/);
  assert.deepEqual(outcomeMessage("kernel-lsp.importProfile", { status: "empty", kernels: [], problems: [],
    summary: "no kernel profiled: none found" }),
  { level: "warning", text: "kernel-lsp: no kernel profile imported: no kernel profiled: none found" });
  assert.deepEqual(outcomeMessage("kernel-lsp.importProfile", { status: "empty", kernels: [], problems: ["bad row"] }),
    { level: "warning", text: "kernel-lsp: no kernel profile imported: bad row" });
  assert.deepEqual(outcomeMessage("kernel-lsp.importProfile", { status: "error", message: "cannot read /x.csv" }),
    { level: "error", text: "kernel-lsp: cannot read /x.csv" });
  assert.equal(outcomeMessage("kernel-lsp.importProfile", undefined), undefined);
});

test("import arguments: one object, raw only when given; files a caller passes", () => {
  assert.deepEqual(importProfileArguments({ details: "/p/d.csv", raw: "/p/r.csv" }),
    [{ details: "/p/d.csv", raw: "/p/r.csv" }]);
  assert.deepEqual(importProfileArguments({ details: "/p/d.csv" }), [{ details: "/p/d.csv" }]);
  assert.deepEqual(importProfileArguments({ details: "/p/d.csv", raw: undefined }), [{ details: "/p/d.csv" }]);
  assert.equal(IMPORT_PROFILE_COMMAND, "kernel-lsp.importProfile");
  assert.equal(givenProfileFiles([]), undefined);
  assert.equal(givenProfileFiles([{}]), undefined);
  assert.equal(givenProfileFiles([null]), undefined);
  assert.equal(givenProfileFiles([""]), undefined);
  assert.deepEqual(givenProfileFiles([{ details: "d.csv", raw: "r.csv" }]), { details: "d.csv", raw: "r.csv" });
  assert.deepEqual(givenProfileFiles([{ details: "d.csv", raw: "" }]), { details: "d.csv" });
  assert.deepEqual(givenProfileFiles(["d.csv", "r.csv"]), { details: "d.csv", raw: "r.csv" });
  assert.deepEqual(givenProfileFiles(["file:///p/d.csv"]), { details: "file:///p/d.csv" });
});

test("a command cancelled by a server restart is said as stopped, not as failed", () => {
  const cancelled = new Error('Request with id "12" is canceled');
  const restarted = commandEndedMessage("kernel-lsp.verify", cancelled, true);
  assert.equal(restarted.isError, false);
  assert.match(restarted.text, /^kernel-lsp: kernel-lsp.verify stopped: the server restarted while it ran; run it again$/);
  assert.doesNotMatch(restarted.text, /canceled|failed/);
  const failed = commandEndedMessage("kernel-lsp.verify", cancelled, false);  // the same server: a real failure
  assert.deepEqual(failed, { text: 'kernel-lsp: kernel-lsp.verify failed: Error: Request with id "12" is canceled', isError: true });
});
