import assert from "node:assert/strict";
import { test } from "node:test";

import { Inspected, explicitValue, needsRestart, pythonPathSettingsCommand, sectionKeys, serverSettings }
  from "../src/pure/settings";

function reader(values: Record<string, Inspected>) {
  return { keys: () => Object.keys(values), inspect: (key: string) => values[key] };
}

test("only settings the user set go to the server, so pyproject's values are not hidden by defaults", () => {
  const sent = serverSettings(reader({
    arch: { globalValue: ["sm_80"] },
    debounceMs: {},
    resourceUsage: { globalValue: "both", workspaceValue: "codeLens" },
    agentTemperature: { workspaceValue: null },
  }));
  assert.deepEqual(sent, { arch: ["sm_80"], resourceUsage: "codeLens", agentTemperature: null });
});

test("the extension's own settings are never sent to the server", () => {
  const sent = serverSettings(reader({
    server: { globalValue: { pythonPath: "/usr/bin/python3" } },
    trace: { globalValue: { server: "verbose" } },
    worker: { workspaceValue: "tcp:127.0.0.1:7777" },
  }));
  assert.deepEqual(sent, { worker: "tcp:127.0.0.1:7777" });
});

test("object settings merge across scopes, narrower scopes winning per key", () => {
  assert.deepEqual(explicitValue({ globalValue: { compile: false, pythonSyntax: false },
    workspaceFolderValue: { compile: true } }), { compile: true, pythonSyntax: false });
  assert.deepEqual(explicitValue({ globalValue: ["a"], workspaceValue: ["b"] }), ["b"]);
  assert.equal(explicitValue(undefined), undefined);
});

test("keys of a WorkspaceConfiguration-like object leave its methods out", () => {
  const configuration = { get() {}, has() {}, inspect() {}, update() {}, arch: ["sm_90"], server: {}, ignore: [] };
  assert.deepEqual(sectionKeys(configuration), ["arch", "server", "ignore"]);
});

test("only launch settings restart the server", () => {
  assert.equal(needsRestart((s) => s === "kernelLsp.server.pythonPath"), true);
  assert.equal(needsRestart((s) => s === "kernelLsp.server.logLevel"), true);
  assert.equal(needsRestart((s) => s === "kernelLsp" || s === "kernelLsp.arch"), false);
});

test("Open Settings leads where pythonPath can be set: the Remote tab in a remote window, else User", () => {
  // machine-overridable: a remote window (code-server, SSH, WSL) lists it under Remote only
  assert.deepEqual(pythonPathSettingsCommand("ssh-remote"),
    ["workbench.action.openRemoteSettings", { query: "kernelLsp.server.pythonPath" }]);
  assert.deepEqual(pythonPathSettingsCommand(undefined),
    ["workbench.action.openSettings", "kernelLsp.server.pythonPath"]);
});
