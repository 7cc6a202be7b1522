import assert from "node:assert/strict";
import * as path from "node:path";
import { test } from "node:test";

import { expandPath, importCheck, resolveInterpreter, serverArguments, serverExecutable, which }
  from "../src/pure/interpreter";

const none = async () => undefined;
const nothingOnPath = () => undefined;

test("the setting wins, with ~ and ${workspaceFolder} expanded", async () => {
  const found = await resolveInterpreter({ configured: " ${workspaceFolder}/.venv/bin/python ",
    pythonExtension: async () => "/other/python", which: () => "/usr/bin/python3", home: "/home/u",
    workspaceFolder: "/ws" });
  assert.deepEqual(found, { path: "/ws/.venv/bin/python", source: "setting" });
  assert.equal(expandPath("~/venv/bin/python", "/home/u"), path.join("/home/u", "venv/bin/python"));
});

test("then the Python extension's interpreter, then python3 on PATH", async () => {
  assert.deepEqual(await resolveInterpreter({ configured: "", pythonExtension: async () => "/venv/bin/python",
    which: () => "/usr/bin/python3", home: "/h" }), { path: "/venv/bin/python", source: "python-extension" });
  const looked: string[] = [];
  const found = await resolveInterpreter({ configured: "", pythonExtension: none, home: "/h",
    which: (name) => { looked.push(name); return name === "python3" ? "/usr/bin/python3" : undefined; } });
  assert.deepEqual(found, { path: "/usr/bin/python3", source: "PATH" });
  assert.equal(looked[0], process.platform === "win32" ? "python" : "python3");
});

test("no interpreter anywhere says what to set", async () => {
  const found = await resolveInterpreter({ configured: "", pythonExtension: none, which: nothingOnPath, home: "/h" });
  assert.ok("problem" in found);
  assert.match(found.problem, /kernelLsp\.server\.pythonPath/);
});

test("which walks PATH in order and skips empty entries", () => {
  const executables = new Set([path.join("/b", "python3"), path.join("/c", "python3")]);
  assert.equal(which("python3", "::/a:/b:/c", (f) => executables.has(f), ":"), path.join("/b", "python3"));
  assert.equal(which("python3", "/a", (f) => executables.has(f), ":"), undefined);
});

test("the server command line puts --log-level before serve", () => {
  assert.deepEqual(serverArguments("INFO"), ["-m", "kernel_lsp", "--log-level", "INFO", "serve"]);
  assert.deepEqual(serverArguments("LOUD"), ["-m", "kernel_lsp", "--log-level", "WARNING", "serve"]);
});

test("the executable speaks stdio without a --stdio argument the server would refuse", () => {
  const executable = serverExecutable({ path: "/venv/bin/python", source: "setting" }, "DEBUG", { A: "1" }, "/ws");
  assert.deepEqual(executable, { command: "/venv/bin/python",
    args: ["-m", "kernel_lsp", "--log-level", "DEBUG", "serve"], options: { env: { A: "1" }, cwd: "/ws" } });
  assert.equal("transport" in executable, false);
});

test("the import check runs where the server will: -c, like -m, imports from the current folder first", () => {
  const python = { path: "/venv/bin/python", source: "PATH" } as const;
  const check = importCheck(python, "/ws");
  assert.deepEqual(check, { command: "/venv/bin/python", args: ["-c", "import kernel_lsp"], options: { cwd: "/ws" } });
  assert.equal(check.options.cwd, serverExecutable(python, "INFO", {}, "/ws").options.cwd);
});
