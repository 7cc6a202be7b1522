// Client capabilities the server's features depend on, made explicit rather than left to the library's defaults.

import type { ClientCapabilities } from "vscode-languageserver-protocol";

/**
 * The optimize result is a workspace/applyEdit under a change annotation with needsConfirmation: the server
 * sends it that way only when the client advertises documentChanges and changeAnnotationSupport, and VS Code
 * then opens the refactor preview instead of applying the edit unseen.
 */
export function ensureEditCapabilities(capabilities: ClientCapabilities): ClientCapabilities {
  const workspace = (capabilities.workspace ??= {});
  workspace.applyEdit = true;
  const edit = (workspace.workspaceEdit ??= {});
  edit.documentChanges = true;
  edit.changeAnnotationSupport ??= { groupsOnLabel: true };
  const window = (capabilities.window ??= {});
  window.workDoneProgress = true;  // $/progress in the status bar, with its cancel button when clicked
  return capabilities;
}
