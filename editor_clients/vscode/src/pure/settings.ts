// Which settings of the "kernelLsp" section go to the server, and which ones only the extension reads.

export const SECTION = "kernelLsp";
/** Top-level keys under kernelLsp that configure the extension itself; the server would call them unknown. */
export const CLIENT_ONLY_KEYS: readonly string[] = ["server", "trace"];
/** Settings whose change needs a new server process (the rest reach the running server). */
export const LAUNCH_SETTINGS: readonly string[] = ["kernelLsp.server.pythonPath", "kernelLsp.server.logLevel"];
export const PYTHON_PATH_SETTING = "kernelLsp.server.pythonPath";

/**
 * The command (and its argument) that opens the settings where kernelLsp.server.pythonPath can be set. The setting
 * is machine-overridable, so in a remote window (code-server, SSH, WSL, a container: `vscode.env.remoteName` set)
 * VS Code lists it under the Remote tab only, never under User; elsewhere the user settings, filtered to it.
 */
export function pythonPathSettingsCommand(remoteName: string | undefined): [string, unknown] {
  return remoteName
    ? ["workbench.action.openRemoteSettings", { query: PYTHON_PATH_SETTING }]
    : ["workbench.action.openSettings", PYTHON_PATH_SETTING];
}

/** kernel_lsp/config.py SECRET_SETTINGS: kept in VS Code's secret storage, given to the server as its env var. */
export const API_KEY_SECRET = "kernelLsp.anthropicApiKey";
export const API_KEY_ENV = "ANTHROPIC_API_KEY";

/** What vscode.WorkspaceConfiguration.inspect returns, for the scopes a user can set. */
export interface Inspected {
  globalValue?: unknown;
  workspaceValue?: unknown;
  workspaceFolderValue?: unknown;
}

export interface SectionReader {
  keys(): string[];
  inspect(key: string): Inspected | undefined;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The value the user set, narrowest scope first; objects are merged across scopes as VS Code merges them. */
export function explicitValue(inspected: Inspected | undefined): unknown {
  if (!inspected) {
    return undefined;
  }
  const scoped = [inspected.globalValue, inspected.workspaceValue, inspected.workspaceFolderValue]
    .filter((value) => value !== undefined);
  if (scoped.length === 0) {
    return undefined;
  }
  if (scoped.every(isPlainObject)) {
    return Object.assign({}, ...scoped);
  }
  return scoped[scoped.length - 1];
}

/**
 * The settings the user set (user, workspace or folder scope), keyed as the server reads them (camelCase).
 * Defaults are left out on purpose: the server layers pyproject's [tool.kernel-lsp] below the editor's settings,
 * and a default sent from here would hide the project's own value.
 */
export function serverSettings(section: SectionReader): Record<string, unknown> {
  const result: Record<string, unknown> = {};
  for (const key of section.keys()) {
    if (CLIENT_ONLY_KEYS.includes(key)) {
      continue;
    }
    const value = explicitValue(section.inspect(key));
    if (value !== undefined) {
      result[key] = value;
    }
  }
  return result;
}

/** The setting keys of a vscode.WorkspaceConfiguration: its values are properties beside its methods. */
export function sectionKeys(configuration: object): string[] {
  return Object.entries(configuration).filter(([, value]) => typeof value !== "function").map(([key]) => key);
}

/** Whether a configuration change needs the server restarted. */
export function needsRestart(affects: (setting: string) => boolean): boolean {
  return LAUNCH_SETTINGS.some((setting) => affects(setting));
}
