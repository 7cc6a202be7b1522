// What the editor says after a kernel-lsp.* command answers; the server already tells the user of most failures.

export type Level = "info" | "warning" | "error";

export interface Said {
  level: Level;
  text: string;
}

export type CommandResult = Record<string, unknown> | null | undefined;

function text(value: unknown): string | undefined {
  return typeof value === "string" && value ? value : undefined;
}

/** The message for a command's result, or undefined when the server has said it already (or nothing is to say). */
export function outcomeMessage(command: string, result: CommandResult): Said | undefined {
  if (!result || typeof result !== "object") {
    return undefined;
  }
  const status = text(result.status);
  const message = text(result.message);
  if (status === "error") {
    // The server tells the user itself only of the optimize command's errors that concern a document.
    return command === "kernel-lsp.optimize" && result.uri ? undefined
      : { level: "error", text: `kernel-lsp: ${message ?? "the command failed"}` };
  }
  switch (command) {
    case "kernel-lsp.verify":
      if (status === "ok") {
        // a job that ran may still have no verdict ("not verified: needs a GPU") or a rejection: its summary says it
        return result.verdict === "verified"
          ? { level: "info", text: `kernel-lsp: verified: ${text(result.summary) ?? "done"}` }
          : { level: "warning", text: `kernel-lsp: ${text(result.summary) ?? "not verified"}` };
      }
      return status === "unavailable"
        ? { level: "warning", text: `kernel-lsp: no verdict: ${text(result.summary) ?? "worker unavailable"}` }
        : undefined;
    case "kernel-lsp.profile": {
      // the server says a profile with problems itself, in one message with them
      const problems = Array.isArray(result.problems) ? result.problems.filter((p) => text(p)) : [];
      return (status === "ok" || status === "not-profiled") && !problems.length
        ? { level: "info", text: `kernel-lsp: profile: ${message ?? status}` }
        : undefined;
    }
    case "kernel-lsp.optimize":
      return status === "started"
        ? { level: "info", text: "kernel-lsp: optimizing; its progress in the status bar can cancel it (click it), " +
            "and the best verified version comes back as an edit to preview" }
        : undefined;
    case "kernel-lsp.sanitize":
      if (status === "ok") {
        return { level: result.clean ? "info" : "warning",
          text: `kernel-lsp: compute-sanitizer: ${text(result.summary) ?? "done"}` };
      }
      return undefined; // unavailable: the server said why nothing was checked
    case "kernel-lsp.importProfile": {
      const problems = Array.isArray(result.problems) ? result.problems.filter((p) => text(p)) : [];
      const notes = problems.length ? ` (${problems.join("; ")})` : "";
      if (status === "ok") {
        return { level: "info", text: `kernel-lsp: profile imported: ${text(result.summary) ?? "done"}${notes}; ` +
            "hover a kernel name for its card" };
      }
      return status === "empty"
        ? { level: "warning", text: `kernel-lsp: no kernel profile imported: ${text(result.summary) ??
            (problems.join("; ") || "none found")}` }
        : undefined;
    }
    default:
      return undefined;
  }
}
