import assert from "node:assert/strict";
import { test } from "node:test";

import { ensureEditCapabilities } from "../src/pure/capabilities";
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
  assert.deepEqual(outcomeMessage("kernel-lsp.verify", { status: "ok", summary: "correct, 1.8x eager" }),
    { level: "info", text: "kernel-lsp: verified: correct, 1.8x eager" });
  assert.equal(outcomeMessage("kernel-lsp.verify", { status: "not-a-candidate", message: "x" }), undefined);
  assert.equal(outcomeMessage("kernel-lsp.verify", { status: "cancelled" }), undefined);
  assert.equal(outcomeMessage("kernel-lsp.profile", { status: "unavailable", message: "no worker" }), undefined);
  assert.equal(outcomeMessage("kernel-lsp.profile", { status: "not-profiled", message: "static only" })?.level, "info");
  assert.equal(outcomeMessage("kernel-lsp.optimize", { uri: "file:///a.py", status: "error", message: "no key" }),
    undefined);
  assert.equal(outcomeMessage("kernel-lsp.optimize", { status: "started", uri: "file:///a.py" })?.level, "info");
  assert.deepEqual(outcomeMessage("kernel-lsp.profile", { status: "error", message: "cannot profile x" }),
    { level: "error", text: "kernel-lsp: cannot profile x" });
  assert.equal(outcomeMessage("kernel-lsp.verify", undefined), undefined);
});
