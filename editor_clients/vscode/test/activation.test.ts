// activate() against a stand-in `vscode` module: commands registered, status bar shown, and an interpreter
// without kernel_lsp reported to the user instead of a server that crashes on start.
import assert from "node:assert/strict";
import Module from "node:module";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";

import * as esbuild from "esbuild";

import { EXTENSION_COMMANDS } from "../src/pure/commands";

const root = path.resolve(__dirname, "..", "..");

interface Recorded {
  commands: string[];
  channels: string[];
  errors: string[];
  statusTexts: string[];
  shown: boolean;
}

/** A stand-in for the parts of the vscode API that activation touches; anything else is an inert stub. */
function fakeVscode(settings: Record<string, unknown>, recorded: Recorded): unknown {
  const disposable = { dispose() {} };
  const stub: unknown = new Proxy(function () {}, {
    get: (_target, key) => (key === "then" ? undefined : stub),
    apply: () => stub,
    construct: () => stub as object,
  });
  const configuration = {
    get: (key: string, fallback?: unknown) => (key in settings ? settings[key] : fallback),
    has: (key: string) => key in settings,
    inspect: (key: string) => (key in settings ? { globalValue: settings[key] } : {}),
    update: async () => undefined,
  };
  const statusItem = {
    set text(value: string) { recorded.statusTexts.push(value); },
    tooltip: "", command: "", name: "", backgroundColor: undefined,
    show() { recorded.shown = true; }, dispose() {},
  };
  const api = {
    window: {
      createOutputChannel: (name: string) => {
        recorded.channels.push(name);
        return { appendLine() {}, append() {}, show() {}, dispose() {}, clear() {} };
      },
      createStatusBarItem: () => statusItem,
      showErrorMessage: async (message: string) => { recorded.errors.push(message); return undefined; },
      showWarningMessage: async () => undefined,
      showInformationMessage: async () => undefined,
      onDidChangeActiveTextEditor: () => disposable,
      onDidChangeVisibleTextEditors: () => disposable,
      activeTextEditor: undefined,
      visibleTextEditors: [],
    },
    commands: {
      registerCommand: (id: string) => { recorded.commands.push(id); return disposable; },
      executeCommand: async () => undefined,
    },
    workspace: {
      getConfiguration: () => configuration,
      onDidChangeConfiguration: () => disposable,
      workspaceFolders: undefined,
    },
    extensions: { getExtension: () => undefined },
    StatusBarAlignment: { Left: 1, Right: 2 },
    ConfigurationTarget: { Global: 1, Workspace: 2, WorkspaceFolder: 3 },
    ThemeColor: class { constructor(readonly id: string) {} },
  };
  return new Proxy(api, { get: (target, key) => (key in target ? target[key as keyof typeof api] : stub) });
}

function bundle(): string {
  const out = path.join(root, "out", "activation", "extension.js");
  esbuild.buildSync({ entryPoints: [path.join(root, "src", "extension.ts")], bundle: true, platform: "node",
    format: "cjs", external: ["vscode"], outfile: out, logLevel: "warning" });
  return out;
}

async function activateWith(settings: Record<string, unknown>): Promise<Recorded> {
  const recorded: Recorded = { commands: [], channels: [], errors: [], statusTexts: [], shown: false };
  const vscode = fakeVscode(settings, recorded);
  const load = (Module as unknown as { _load: (request: string, ...rest: unknown[]) => unknown })._load;
  (Module as unknown as { _load: unknown })._load = (request: string, ...rest: unknown[]) =>
    request === "vscode" ? vscode : load(request, ...rest);
  try {
    const file = bundle();
    delete require.cache[file];
    const extension = require(file);
    const secrets = { get: async () => undefined, store: async () => undefined, delete: async () => undefined };
    await extension.activate({ subscriptions: [], secrets });
    await extension.deactivate();
  } finally {
    (Module as unknown as { _load: unknown })._load = load;
  }
  return recorded;
}

test("activation registers every contributed command and shows the status bar item", async () => {
  const missing = path.join(os.tmpdir(), "no-such-python-for-kernel-lsp");
  const recorded = await activateWith({ "server.pythonPath": missing });
  assert.deepEqual([...recorded.commands].sort(), [...EXTENSION_COMMANDS].sort());
  assert.deepEqual(recorded.channels, ["kernel-lsp", "kernel-lsp worker"]);
  assert.equal(recorded.shown, true);
  assert.equal(recorded.errors.length, 1);
  assert.match(recorded.errors[0], /cannot import kernel_lsp/);
  assert.match(recorded.errors[0], /kernelLsp\.server\.pythonPath/);
  assert.equal(recorded.statusTexts[recorded.statusTexts.length - 1], "$(circle-slash) kernel-lsp");
});
