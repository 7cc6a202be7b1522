// Which Python runs `-m kernel_lsp serve`: the setting, else the Python extension's interpreter, else PATH.

import * as path from "node:path";

export type InterpreterSource = "setting" | "python-extension" | "PATH";

export interface Interpreter {
  path: string;
  source: InterpreterSource;
}

export interface InterpreterLookup {
  /** kernelLsp.server.pythonPath, as the user wrote it. */
  configured: string;
  /** The interpreter selected in the Python extension, when it is installed. */
  pythonExtension(): Promise<string | undefined>;
  /** The full path of an executable on PATH. */
  which(name: string): string | undefined;
  home: string;
  workspaceFolder?: string;
}

export const PATH_NAMES: readonly string[] = process.platform === "win32" ? ["python", "py"] : ["python3", "python"];

/** `~` and `${workspaceFolder}` expanded, as in other VS Code path settings. */
export function expandPath(value: string, home: string, workspaceFolder?: string): string {
  let expanded = value.trim();
  if (expanded === "~" || expanded.startsWith("~/")) {
    expanded = path.join(home, expanded.slice(1));
  }
  if (workspaceFolder !== undefined) {
    expanded = expanded.split("${workspaceFolder}").join(workspaceFolder);
  }
  return expanded;
}

/** The interpreter to use, or why there is none. */
export async function resolveInterpreter(lookup: InterpreterLookup): Promise<Interpreter | { problem: string }> {
  if (lookup.configured.trim()) {
    return { path: expandPath(lookup.configured, lookup.home, lookup.workspaceFolder), source: "setting" };
  }
  const selected = await lookup.pythonExtension();
  if (selected) {
    return { path: selected, source: "python-extension" };
  }
  for (const name of PATH_NAMES) {
    const found = lookup.which(name);
    if (found) {
      return { path: found, source: "PATH" };
    }
  }
  return {
    problem: `no Python interpreter found: set kernelLsp.server.pythonPath, select one in the Python extension, ` +
      `or put ${PATH_NAMES.join(" or ")} on PATH`,
  };
}

/** The full path of `name` in the PATH directories, using `isExecutable` to test each candidate. */
export function which(name: string, searchPath: string, isExecutable: (file: string) => boolean,
  delimiter: string = path.delimiter, extensions: readonly string[] = [""]): string | undefined {
  for (const dir of searchPath.split(delimiter)) {
    if (!dir) {
      continue;
    }
    for (const extension of extensions) {
      const candidate = path.join(dir, name + extension);
      if (isExecutable(candidate)) {
        return candidate;
      }
    }
  }
  return undefined;
}

export const LOG_LEVELS: readonly string[] = ["DEBUG", "INFO", "WARNING", "ERROR"];

/** The server's command line: `--log-level` belongs to the top-level parser, before `serve`. */
export function serverArguments(logLevel: string): string[] {
  const level = LOG_LEVELS.includes(logLevel) ? logLevel : "WARNING";
  return ["-m", "kernel_lsp", "--log-level", level, "serve"];
}

/**
 * vscode-languageclient's Executable for the server. No `transport`: with TransportKind.stdio the library appends
 * `--stdio` to the arguments, which `kernel-lsp serve` refuses; without one it speaks over stdio all the same.
 */
export function serverExecutable(interpreter: Interpreter, logLevel: string, env: NodeJS.ProcessEnv,
  cwd: string | undefined): { command: string; args: string[]; options: { env: NodeJS.ProcessEnv; cwd?: string } } {
  return { command: interpreter.path, args: serverArguments(logLevel), options: { env, cwd } };
}

/**
 * The check that `interpreter` can import kernel_lsp, run in the server's folder (`cwd`, as serverExecutable gets
 * it): `-c`, like the server's `-m`, puts the current folder first on sys.path, so a check run elsewhere (the
 * extension host's folder: a kernel-lsp checkout, say) can pass where the server then fails to start.
 */
export function importCheck(interpreter: Interpreter, cwd: string | undefined):
  { command: string; args: string[]; options: { cwd?: string } } {
  return { command: interpreter.path, args: ["-c", "import kernel_lsp"], options: { cwd } };
}
