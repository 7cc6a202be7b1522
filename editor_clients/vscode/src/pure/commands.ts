// The extension's commands and the server commands (kernel_lsp/server/*.py) they call.

export const DOCUMENT_COMMANDS: Readonly<Record<string, string>> = {
  "kernelLsp.verify": "kernel-lsp.verify",  // [uri]: verifies now, answers with the outcome
  "kernelLsp.profile": "kernel-lsp.profile",  // [uri, kernel?]: the whole file when no kernel is named
  "kernelLsp.optimize": "kernel-lsp.optimize",  // [uri]: starts a pass and answers at once
  "kernelLsp.sanitize": "kernel-lsp.sanitize",  // [uri]: compute-sanitizer on the candidate, answers when done
};
export const WORKER_STATUS_COMMAND = "kernel-lsp.workerStatus";  // starts or reaches the worker and pings it
export const IMPORT_PROFILE_COMMAND = "kernel-lsp.importProfile";  // [{details, raw?}]: reads an ncu CSV export

export const EXTENSION_COMMANDS: readonly string[] = [
  ...Object.keys(DOCUMENT_COMMANDS),
  "kernelLsp.restartServer",
  "kernelLsp.importProfile",
  "kernelLsp.workspaceSummary",
  "kernelLsp.showWorkerLog",
  "kernelLsp.connectRemoteWorker",
  "kernelLsp.setAnthropicApiKey",
  "kernelLsp.clearAnthropicApiKey",
];

/** What to tell the user when a server command's request ends in an error: where the server was stopped or
 * restarted while it ran (the API key set, the settings changed), the request was cancelled with it, and that is
 * said as such, with what to do, not as the command's failure ("Request with id 12 is canceled"). */
export function commandEndedMessage(command: string, error: unknown, serverReplaced: boolean): { text: string; isError: boolean } {
  if (serverReplaced) {
    return { text: `kernel-lsp: ${command} stopped: the server restarted while it ran; run it again`, isError: false };
  }
  return { text: `kernel-lsp: ${command} failed: ${String(error)}`, isError: true };
}

/** The server command's arguments for the document at `uri` (as the server's URI converter writes it). */
export function documentCommandArguments(uri: string): unknown[] {
  return [uri];
}

/** The files of `ncu --csv --page details` (and, for the roofline, `--page raw`) exports of one report. */
export interface ProfileFiles {
  details: string;
  raw?: string;
}

/** The server command's arguments for an import: one object, with no `raw` when there is no raw page. */
export function importProfileArguments(files: ProfileFiles): unknown[] {
  return [files.raw ? { details: files.details, raw: files.raw } : { details: files.details }];
}

/**
 * The files given to `kernelLsp.importProfile` by a caller (a keybinding's args, another extension, a test):
 * `{details, raw?}` or `(details, raw?)` as paths or file URIs; undefined when none are given (then it asks).
 */
export function givenProfileFiles(args: readonly unknown[]): ProfileFiles | undefined {
  const first = args[0];
  const [details, raw] = first !== null && typeof first === "object"
    ? [(first as Record<string, unknown>).details, (first as Record<string, unknown>).raw]
    : [first, args[1]];
  if (typeof details !== "string" || !details) {
    return undefined;
  }
  return typeof raw === "string" && raw ? { details, raw } : { details };
}
