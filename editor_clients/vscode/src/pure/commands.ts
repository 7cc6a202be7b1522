// The extension's commands and the server commands (kernel_lsp/server/*.py) they call.

export const DOCUMENT_COMMANDS: Readonly<Record<string, string>> = {
  "kernelLsp.verify": "kernel-lsp.verify",  // [uri]: verifies now, answers with the outcome
  "kernelLsp.profile": "kernel-lsp.profile",  // [uri, kernel?]: the whole file when no kernel is named
  "kernelLsp.optimize": "kernel-lsp.optimize",  // [uri]: starts a pass and answers at once
};
export const WORKER_STATUS_COMMAND = "kernel-lsp.workerStatus";  // starts or reaches the worker and pings it

export const EXTENSION_COMMANDS: readonly string[] = [
  ...Object.keys(DOCUMENT_COMMANDS),
  "kernelLsp.restartServer",
  "kernelLsp.showWorkerLog",
  "kernelLsp.connectRemoteWorker",
  "kernelLsp.setAnthropicApiKey",
  "kernelLsp.clearAnthropicApiKey",
];

/** The server command's arguments for the document at `uri` (as the server's URI converter writes it). */
export function documentCommandArguments(uri: string): unknown[] {
  return [uri];
}
