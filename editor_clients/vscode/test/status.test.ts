import assert from "node:assert/strict";
import { test } from "node:test";

import { WorkerStatus, replacesShownStatus, statusLogLine, statusView } from "../src/pure/status";

const connected: WorkerStatus = { state: "connected", address: "local", gpu: "NVIDIA H100 80GB HBM3", driver: "550.54",
  memory_free_mib: 80000, running_jobs: 0, restarts: 0, message: null, busy: false };

test("the server's own state comes first", () => {
  assert.equal(statusView("stopped", connected).text, "$(circle-slash) kernel-lsp");
  assert.equal(statusView("stopped", connected).warning, true);
  assert.equal(statusView("starting", undefined).text, "$(sync~spin) kernel-lsp");
});

test("a connected worker shows its GPU and whether it is busy", () => {
  const idle = statusView("running", connected);
  assert.equal(idle.text, "$(circuit-board) NVIDIA H100 80GB HBM3: idle");
  assert.match(idle.tooltip, /driver 550\.54/);
  assert.match(idle.tooltip, /80000 MiB/);
  const busy = statusView("running", { ...connected, running_jobs: 2, busy: true });
  assert.equal(busy.text, "$(sync~spin) NVIDIA H100 80GB HBM3: busy (2 jobs)");
  assert.equal(statusView("running", { ...connected, gpu: null }).text, "$(circuit-board) worker (no GPU): idle");
});

test("a failed worker shows as disconnected with the reason in the tooltip", () => {
  const view = statusView("running", { state: "failed", address: "tcp:127.0.0.1:7777",
    message: "kernel-lsp: the GPU worker (tcp:127.0.0.1:7777) is unavailable: Connection refused" });
  assert.equal(view.text, "$(debug-disconnect) worker: disconnected");
  assert.equal(view.warning, true);
  assert.match(view.tooltip, /Connection refused/);
  assert.match(view.tooltip, /tcp:127\.0\.0\.1:7777/);
});

test("before any job: a local worker is not started, a remote one not connected", () => {
  assert.equal(statusView("running", undefined).text, "$(circuit-board) worker: not started");
  assert.equal(statusView("running", { state: "stopped", address: "tcp:h:1" }).text, "$(plug) worker: not connected");
  const configured = statusView("running", undefined, "tcp:gpu:7777");
  assert.equal(configured.text, "$(plug) worker: not connected");
  assert.match(configured.tooltip, /tcp:gpu:7777/);
  assert.equal(statusView("running", { state: "restarting", address: "local" }).text, "$(sync~spin) worker: restarting");
});

test("log lines carry the time, the address, the state and the message", () => {
  const line = statusLogLine({ ...connected, running_jobs: 1, busy: true, restarts: 2 }, new Date(Date.UTC(2026, 0, 2)));
  assert.equal(line, "[2026-01-02T00:00:00.000Z] local worker connected gpu=NVIDIA H100 80GB HBM3 busy (1 job) restarts=2");
});

test("a replaced connection's late 'stopped' does not hide the worker now in use", () => {
  const remote: WorkerStatus = { state: "failed", address: "tcp:127.0.0.1:7777", message: "Connection refused" };
  const oldLocal: WorkerStatus = { state: "stopped", address: "local" };
  assert.equal(replacesShownStatus(remote, oldLocal), false);  // the local worker closed after the switch
  assert.equal(replacesShownStatus({ ...connected, address: "tcp:h:1" }, oldLocal), false);
  assert.equal(replacesShownStatus(connected, oldLocal), true);  // the worker in use stopped
  assert.equal(replacesShownStatus(undefined, oldLocal), true);
  assert.equal(replacesShownStatus({ state: "stopped", address: "tcp:h:1" }, oldLocal), true);
  assert.equal(replacesShownStatus(connected, remote), true);  // anything else from another address: a new worker
  assert.equal(replacesShownStatus(remote, { ...connected, state: "starting" }), true);
});
