// The status bar item and the worker log lines, from the server's kernelLsp/workerStatus notifications.

export const STATUS_NOTIFICATION = "kernelLsp/workerStatus";

/** kernel_lsp.worker.client.WorkerStatus.to_dict(). */
export interface WorkerStatus {
  state: "stopped" | "starting" | "connected" | "restarting" | "failed" | string;
  address: string;
  gpu?: string | null;
  driver?: string | null;
  memory_free_mib?: number | null;
  versions?: Record<string, unknown>;
  running_jobs?: number;
  restarts?: number;
  message?: string | null;
  busy?: boolean;
}

export type ServerState = "starting" | "running" | "stopped";

export interface StatusView {
  text: string;
  tooltip: string;
  warning: boolean;
}

function jobs(count: number): string {
  return count === 1 ? "1 job" : `${count} jobs`;
}

function where(status: WorkerStatus): string {
  return status.address && status.address !== "local" ? status.address : "local worker";
}

/**
 * The status bar text ($(icon) codicons), its tooltip, and whether it shows as a warning. `configuredWorker` is
 * the `worker` setting, which says before the first notification whether the worker is local or remote.
 */
export function statusView(server: ServerState, status: WorkerStatus | undefined, configuredWorker = ""): StatusView {
  if (server === "stopped") {
    return { text: "$(circle-slash) kernel-lsp", tooltip: "kernel-lsp: the server is not running", warning: true };
  }
  if (server === "starting") {
    return { text: "$(sync~spin) kernel-lsp", tooltip: "kernel-lsp: starting the server", warning: false };
  }
  const tooltip = tooltipLines(status, configuredWorker).join("\n");
  if (status === undefined || status.state === "stopped") {
    const remote = status !== undefined ? status.address !== "local" : configuredWorker.trim() !== "";
    return { text: remote ? "$(plug) worker: not connected" : "$(circuit-board) worker: not started",
      tooltip, warning: false };
  }
  switch (status.state) {
    case "starting":
      return { text: "$(sync~spin) worker: starting", tooltip, warning: false };
    case "restarting":
      return { text: "$(sync~spin) worker: restarting", tooltip, warning: true };
    case "failed":
      return { text: "$(debug-disconnect) worker: disconnected", tooltip, warning: true };
    case "connected": {
      const gpu = status.gpu || "worker (no GPU)";
      const running = status.running_jobs ?? 0;
      return status.busy || running > 0
        ? { text: `$(sync~spin) ${gpu}: busy (${jobs(running)})`, tooltip, warning: false }
        : { text: `$(circuit-board) ${gpu}: idle`, tooltip, warning: false };
    }
    default:
      return { text: `$(question) worker: ${status.state}`, tooltip, warning: true };
  }
}

function tooltipLines(status: WorkerStatus | undefined, configuredWorker: string): string[] {
  if (status === undefined) {
    return [configuredWorker.trim()
      ? `kernel-lsp: the worker at ${configuredWorker.trim()} is reached on the first job`
      : "kernel-lsp: no worker yet (a local one starts on the first job)", "Click for the worker log"];
  }
  const lines = [`kernel-lsp ${where(status)}: ${status.state}`];
  if (status.gpu) {
    lines.push(`GPU: ${status.gpu}${status.driver ? ` (driver ${status.driver})` : ""}`);
  } else if (status.state === "connected") {
    lines.push("GPU: none (CPU only)");
  }
  if (typeof status.memory_free_mib === "number") {
    lines.push(`free GPU memory: ${status.memory_free_mib} MiB`);
  }
  if (status.running_jobs) {
    lines.push(`running: ${jobs(status.running_jobs)}`);
  }
  if (status.restarts) {
    lines.push(`restarts: ${status.restarts}`);
  }
  if (status.message) {
    lines.push(status.message);
  }
  lines.push("Click for the worker log");
  return lines;
}

/**
 * Whether a notification replaces the status shown. The server replaces its worker connection when the worker
 * settings change and closes the old one in the background: the old one's last word ("stopped", with the old
 * address) can arrive after the new connection's first ones, and says nothing about the worker now in use.
 */
export function replacesShownStatus(shown: WorkerStatus | undefined, incoming: WorkerStatus): boolean {
  return !(incoming.state === "stopped" && shown !== undefined && shown.state !== "stopped"
    && shown.address !== incoming.address);
}

/** One line of the worker log channel. */
export function statusLogLine(status: WorkerStatus, at: Date): string {
  const parts = [`[${at.toISOString()}]`, where(status), status.state];
  if (status.gpu) {
    parts.push(`gpu=${status.gpu}`);
  }
  if (status.state === "connected") {
    parts.push(status.busy || status.running_jobs ? `busy (${jobs(status.running_jobs ?? 0)})` : "idle");
  }
  if (status.restarts) {
    parts.push(`restarts=${status.restarts}`);
  }
  if (status.message) {
    parts.push(`- ${status.message}`);
  }
  return parts.join(" ");
}
