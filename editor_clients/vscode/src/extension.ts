// VS Code glue: starts `python -m kernel_lsp serve`, wires its settings, commands and worker status.

import { execFile } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as vscode from "vscode";
import {
  ClientCapabilities,
  DidChangeConfigurationNotification,
  ExecuteCommandRequest,
  FeatureState,
  LanguageClient,
  LanguageClientOptions,
  ResponseError,
  ServerOptions,
  State,
  StaticFeature,
} from "vscode-languageclient/node";

import { ensureEditCapabilities } from "./pure/capabilities";
import {
  DOCUMENT_COMMANDS,
  IMPORT_PROFILE_COMMAND,
  ProfileFiles,
  WORKER_STATUS_COMMAND,
  commandEndedMessage,
  documentCommandArguments,
  givenProfileFiles,
  importProfileArguments,
} from "./pure/commands";
import { Interpreter, importCheck, resolveInterpreter, serverExecutable, which } from "./pure/interpreter";
import { CommandResult, outcomeMessage } from "./pure/outcome";
import { API_KEY_ENV, API_KEY_SECRET, SECTION, SectionReader, needsRestart, pythonPathSettingsCommand, sectionKeys,
  serverSettings } from "./pure/settings";
import { STATUS_NOTIFICATION, ServerState, WorkerStatus, replacesShownStatus, statusLogLine, statusView }
  from "./pure/status";
import { SUMMARY_PARAMS, SUMMARY_REQUEST, SUMMARY_TIMEOUT_MS, SummaryItem, summaryFailure, summaryView } from "./pure/summary";
import { ShownDocument, VISIBLE_NOTIFICATION, VisibleDocuments, VisibleDocumentsSender, visibleDocuments }
  from "./pure/visible";
import { workerAddressProblem } from "./pure/workerAddress";

const CLIENT_ID = "kernelLsp";  // the trace setting is CLIENT_ID + ".trace.server"
const PYTHON_EXTENSION = "ms-python.python";
const IMPORT_CHECK_TIMEOUT_MS = 30_000;
const TIMED_OUT = Symbol("timed out");

let extension: KernelLspExtension | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  extension = new KernelLspExtension(context);
  await extension.activate();
}

export async function deactivate(): Promise<void> {
  await extension?.stop();
}

function sectionReader(scope?: vscode.Uri): SectionReader {
  const config = vscode.workspace.getConfiguration(SECTION, scope);
  return {
    keys: () => sectionKeys(config),
    inspect: (key) => config.inspect(key),
  };
}

/** Where the server runs (and its import check): the first workspace folder, else the extension host's folder. */
function serverFolder(): string | undefined {
  return vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
}

/** Says in the initialize request that workspace edits may carry change annotations (the optimize preview). */
class EditCapabilities implements StaticFeature {
  fillClientCapabilities(capabilities: ClientCapabilities): void {
    ensureEditCapabilities(capabilities);
  }
  initialize(): void {}
  getState(): FeatureState {
    return { kind: "static" };
  }
  clear(): void {}
}

class KernelLspExtension {
  private client: LanguageClient | undefined;
  private readonly output = vscode.window.createOutputChannel("kernel-lsp");
  private readonly workerLog = vscode.window.createOutputChannel("kernel-lsp worker");
  private readonly statusItem = vscode.window.createStatusBarItem("kernelLsp.worker", vscode.StatusBarAlignment.Left, 50);
  private serverState: ServerState = "stopped";
  private workerStatus: WorkerStatus | undefined;
  private lifecycle: Promise<void> = Promise.resolve();  // start / stop / restart, one after another
  private readonly visible = new VisibleDocumentsSender(
    (params) => void this.client?.sendNotification(VISIBLE_NOTIFICATION, params).catch(() => undefined),
    () => this.visibleDocuments());

  constructor(private readonly context: vscode.ExtensionContext) {}

  async activate(): Promise<void> {
    const { subscriptions } = this.context;
    subscriptions.push(this.output, this.workerLog, this.statusItem);
    this.statusItem.name = "kernel-lsp worker";
    this.statusItem.command = "kernelLsp.showWorkerLog";
    this.render();
    this.statusItem.show();
    for (const [command, serverCommand] of Object.entries(DOCUMENT_COMMANDS)) {
      subscriptions.push(vscode.commands.registerCommand(command, () => this.runDocumentCommand(serverCommand)));
    }
    subscriptions.push(
      vscode.commands.registerCommand("kernelLsp.importProfile", (...args: unknown[]) => this.importProfile(args)),
      vscode.commands.registerCommand("kernelLsp.workspaceSummary", () => this.workspaceSummary()),
      vscode.commands.registerCommand("kernelLsp.restartServer", () => this.restart("restart requested")),
      vscode.commands.registerCommand("kernelLsp.showWorkerLog", () => this.showWorkerLog()),
      vscode.commands.registerCommand("kernelLsp.connectRemoteWorker", () => this.connectRemoteWorker()),
      vscode.commands.registerCommand("kernelLsp.setAnthropicApiKey", () => this.setApiKey()),
      vscode.commands.registerCommand("kernelLsp.clearAnthropicApiKey", () => this.clearApiKey()),
      vscode.workspace.onDidChangeConfiguration((event) => this.configurationChanged(event)),
      vscode.window.onDidChangeActiveTextEditor(() => this.visible.changed()),
      vscode.window.onDidChangeVisibleTextEditors(() => this.visible.changed()),
      { dispose: () => this.visible.cancel() },
    );
    this.watchPythonExtension();
    void this.restart("activated");  // commands wait for it; activation itself does not
  }

  // --- server lifecycle ------------------------------------------------------------------------------------

  restart(reason: string): Promise<void> {
    this.lifecycle = this.lifecycle.then(async () => {
      this.output.appendLine(`[kernel-lsp] (re)starting the server: ${reason}`);
      await this.stopClient();
      await this.startClient();
    });
    return this.lifecycle;
  }

  stop(): Promise<void> {
    this.lifecycle = this.lifecycle.then(() => this.stopClient());
    return this.lifecycle;
  }

  private async stopClient(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    if (client === undefined) {
      return;
    }
    try {
      await client.stop(10_000);
    } catch (error) {
      this.output.appendLine(`[kernel-lsp] stopping the server: ${String(error)}`);
    }
    await client.dispose().catch(() => undefined);
    this.workerStatus = undefined;
    this.setServerState("stopped");
  }

  private async startClient(): Promise<void> {
    this.setServerState("starting");
    const interpreter = await this.interpreter();
    if ("problem" in interpreter) {
      this.fail(`kernel-lsp: ${interpreter.problem}`);
      return;
    }
    this.output.appendLine(`[kernel-lsp] Python: ${interpreter.path} (from ${interpreter.source})`);
    const importProblem = await this.importProblem(interpreter);
    if (importProblem !== undefined) {
      this.fail(importProblem);
      return;
    }
    const client = new LanguageClient(CLIENT_ID, "kernel-lsp", await this.serverOptions(interpreter),
      this.clientOptions());
    client.registerFeature(new EditCapabilities());
    client.onDidChangeState((event) => {
      if (this.client === client) {
        this.setServerState(event.newState === State.Running ? "running"
          : event.newState === State.Starting ? "starting" : "stopped");
        if (event.newState === State.Running) {
          this.visible.reset();  // a new (or restarted) server process knows nothing of the editors yet
          this.visible.flush();
        }
      }
    });
    client.onNotification(STATUS_NOTIFICATION, (status: WorkerStatus) => this.workerStatusChanged(status));
    this.client = client;
    try {
      await client.start();
    } catch (error) {
      this.fail(`kernel-lsp: the server did not start: ${String(error)}`);
    }
  }

  private async serverOptions(interpreter: Interpreter): Promise<ServerOptions> {
    const env: NodeJS.ProcessEnv = { ...process.env };
    const apiKey = await this.context.secrets.get(API_KEY_SECRET);
    if (apiKey) {
      env[API_KEY_ENV] = apiKey;  // the server reads $ANTHROPIC_API_KEY; an env var never shows in a message trace
    }
    const logLevel = vscode.workspace.getConfiguration(SECTION).get<string>("server.logLevel", "WARNING");
    return serverExecutable(interpreter, logLevel, env, serverFolder());
  }

  private clientOptions(): LanguageClientOptions {
    return {
      documentSelector: [
        { scheme: "file", language: "cuda-cpp" },
        { scheme: "file", language: "python" },
        { scheme: "file", pattern: "**/*.{cu,cuh}" },
      ],
      outputChannel: this.output,
      // No initializationOptions: the server pulls workspace/configuration once initialized, and a value sent
      // here would stay behind as a layer after the user removes that setting.
      middleware: {
        workspace: {
          configuration: async (params, token, next) => {
            const answers = await next(params, token);
            if (answers instanceof ResponseError || !Array.isArray(answers)) {
              return answers;
            }
            return params.items.map((item, index) => item.section === SECTION
              ? serverSettings(sectionReader(item.scopeUri ? vscode.Uri.parse(item.scopeUri) : undefined))
              : answers[index]);
          },
        },
      },
    };
  }

  private async interpreter(): Promise<Interpreter | { problem: string }> {
    const folder = vscode.workspace.workspaceFolders?.[0];
    return resolveInterpreter({
      configured: vscode.workspace.getConfiguration(SECTION, folder?.uri).get<string>("server.pythonPath", ""),
      pythonExtension: () => pythonExtensionInterpreter(folder?.uri, (m) => this.output.appendLine(m)),
      which: (name) => which(name, process.env.PATH ?? "", isExecutable, undefined,
        process.platform === "win32" ? [".exe", ""] : [""]),
      home: os.homedir(),
      workspaceFolder: folder?.uri.fsPath,
    });
  }

  /** Why `interpreter` cannot run kernel-lsp, checked first so the user sees that rather than a crash loop. */
  private importProblem(interpreter: Interpreter): Promise<string | undefined> {
    const check = importCheck(interpreter, serverFolder());
    return new Promise((resolve) => {
      execFile(check.command, check.args, { ...check.options, timeout: IMPORT_CHECK_TIMEOUT_MS },
        (error, _stdout, stderr) => {
          if (!error) {
            resolve(undefined);
            return;
          }
          const detail = stderr.trim().split("\n").pop() || error.message;
          resolve(`kernel-lsp: ${interpreter.path} (from ${interpreter.source}) cannot import kernel_lsp: ` +
            `${detail}. Install kernel-lsp into that interpreter, or set kernelLsp.server.pythonPath.`);
        });
    });
  }

  private fail(message: string): void {
    this.output.appendLine(`[kernel-lsp] ${message}`);
    this.setServerState("stopped");
    void vscode.window.showErrorMessage(message, "Open Settings", "Show Log").then((choice) => {
      if (choice === "Open Settings") {
        const [command, argument] = pythonPathSettingsCommand(vscode.env.remoteName);
        void vscode.commands.executeCommand(command, argument);
      } else if (choice === "Show Log") {
        this.output.show(true);
      }
    });
  }

  private configurationChanged(event: vscode.ConfigurationChangeEvent): void {
    if (event.affectsConfiguration(`${SECTION}.worker`)) {
      this.render();
    }
    if (needsRestart((setting) => event.affectsConfiguration(setting))) {
      void this.restart("server settings changed");
    } else if (event.affectsConfiguration(SECTION) && this.client?.isRunning()) {
      // The server answers by pulling workspace/configuration, which the middleware above answers.
      void this.client.sendNotification(DidChangeConfigurationNotification.type,
        { settings: { [SECTION]: serverSettings(sectionReader()) } });
    }
  }

  private watchPythonExtension(): void {
    const python = vscode.extensions.getExtension(PYTHON_EXTENSION);
    if (python === undefined) {
      return;
    }
    void Promise.resolve(python.isActive ? python.exports : python.activate()).then((api: PythonApi | undefined) => {
      const changed = api?.environments?.onDidChangeActiveEnvironmentPath;
      if (changed) {
        this.context.subscriptions.push(changed(() => {
          if (!vscode.workspace.getConfiguration(SECTION).get<string>("server.pythonPath")) {
            void this.restart("the Python extension's interpreter changed");
          }
        }));
      }
    }, () => undefined);
  }

  // --- worker status ---------------------------------------------------------------------------------------

  private setServerState(state: ServerState): void {
    this.serverState = state;
    this.render();
  }

  private workerStatusChanged(status: WorkerStatus): void {
    this.workerLog.appendLine(statusLogLine(status, new Date()));
    if (replacesShownStatus(this.workerStatus, status)) {
      this.workerStatus = status;
      this.render();
    }
  }

  private render(): void {
    const view = statusView(this.serverState, this.workerStatus,
      vscode.workspace.getConfiguration(SECTION).get<string>("worker", ""));
    this.statusItem.text = view.text;
    this.statusItem.tooltip = view.tooltip;
    this.statusItem.backgroundColor = view.warning ? new vscode.ThemeColor("statusBarItem.warningBackground") : undefined;
  }

  private showWorkerLog(): void {
    if (this.workerStatus === undefined) {
      this.workerLog.appendLine(`[${new Date().toISOString()}] no worker status yet: a local worker starts on the ` +
        "first job (verify, profile, optimize); its own log lines appear in the kernel-lsp channel");
    }
    this.workerLog.show(true);
  }

  // --- the documents on screen --------------------------------------------------------------------------

  /** What the editors show, as the running server should hear it; undefined when no server runs. */
  private visibleDocuments(): VisibleDocuments | undefined {
    const client = this.client;
    if (!client?.isRunning()) {
      return undefined;
    }
    const shown = (editor: vscode.TextEditor): ShownDocument => ({
      scheme: editor.document.uri.scheme,
      uri: client.code2ProtocolConverter.asUri(editor.document.uri),
    });
    const active = vscode.window.activeTextEditor;
    return visibleDocuments(active && shown(active), vscode.window.visibleTextEditors.map(shown));
  }

  // --- commands --------------------------------------------------------------------------------------------

  private async runningClient(): Promise<LanguageClient | undefined> {
    await this.lifecycle;
    if (this.client?.isRunning()) {
      return this.client;
    }
    void vscode.window.showErrorMessage("kernel-lsp: the server is not running (see the kernel-lsp output channel)");
    return undefined;
  }

  private async executeServerCommand(command: string, args: unknown[]): Promise<CommandResult> {
    const client = await this.runningClient();
    if (client === undefined) {
      return undefined;
    }
    try {
      return await client.sendRequest(ExecuteCommandRequest.type, { command, arguments: args });
    } catch (error) {
      // a restart (the API key set, settings changed) stops the client first: its pending requests are cancelled
      const ended = commandEndedMessage(command, error, this.client !== client);
      void (ended.isError ? vscode.window.showErrorMessage(ended.text) : vscode.window.showInformationMessage(ended.text));
      return undefined;
    }
  }

  private async runDocumentCommand(command: string): Promise<void> {
    const document = vscode.window.activeTextEditor?.document;
    if (document === undefined || document.uri.scheme !== "file") {
      void vscode.window.showWarningMessage(`kernel-lsp: open a saved kernel file first (${command})`);
      return;
    }
    if (command === DOCUMENT_COMMANDS["kernelLsp.profile"] && document.isDirty) {
      await document.save();  // the profile job runs the file as saved
    }
    const client = await this.runningClient();
    if (client === undefined) {
      return;
    }
    const uri = client.code2ProtocolConverter.asUri(document.uri);
    say(outcomeMessage(command, await this.executeServerCommand(command, documentCommandArguments(uri))));
  }

  /**
   * Reads an Nsight Compute export into the server's profiles: the `ncu --csv --page details` file, then
   * optionally the same report's `--page raw` file (the roofline's bytes and ceilings; cancelling skips it).
   * Hovering a kernel name then shows its card. A caller may pass the files instead: `{details, raw?}`.
   */
  private async importProfile(args: readonly unknown[]): Promise<void> {
    const files = givenProfileFiles(args) ?? await this.pickProfileFiles();
    if (files === undefined) {
      return;
    }
    const toPath = (value: string) => value.startsWith("file:") ? vscode.Uri.parse(value).fsPath : value;
    const sent: ProfileFiles = { details: toPath(files.details), raw: files.raw && toPath(files.raw) };
    say(outcomeMessage(IMPORT_PROFILE_COMMAND,
      await this.executeServerCommand(IMPORT_PROFILE_COMMAND, importProfileArguments(sent))));
  }

  private async pickProfileFiles(): Promise<ProfileFiles | undefined> {
    const filters = { "Nsight Compute CSV": ["csv"], "All files": ["*"] };
    const details = await vscode.window.showOpenDialog({
      title: "kernel-lsp: Nsight Compute details page (ncu --import REPORT --csv --page details > FILE.csv)",
      openLabel: "Import details page",
      canSelectMany: false,
      canSelectFiles: true,
      canSelectFolders: false,
      filters,
      defaultUri: vscode.workspace.workspaceFolders?.[0]?.uri,
    });
    const detailsUri = details?.[0];
    if (detailsUri === undefined) {
      return undefined;
    }
    const raw = await vscode.window.showOpenDialog({
      title: "kernel-lsp: optional raw page of the same report (ncu ... --page raw), for the roofline; " +
        "Cancel to import without it",
      openLabel: "Add raw page",
      canSelectMany: false,
      canSelectFiles: true,
      canSelectFolders: false,
      filters,
      defaultUri: vscode.Uri.joinPath(detailsUri, ".."),
    });
    return { details: detailsUri.fsPath, raw: raw?.[0]?.fsPath };
  }

  /** The server's workspace summary as a quick pick of the kernel files; picking one opens it. */
  private async workspaceSummary(): Promise<void> {
    const client = await this.runningClient();
    if (client === undefined) {
      return;
    }
    // a cancelled request may never be answered: the time limit is a race, and the request cancelled after it
    const cancel = new vscode.CancellationTokenSource();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<typeof TIMED_OUT>((resolve) => {
      timer = setTimeout(() => resolve(TIMED_OUT), SUMMARY_TIMEOUT_MS);
    });
    let answer: unknown;
    try {
      answer = await vscode.window.withProgress({ location: vscode.ProgressLocation.Window,
        title: "kernel-lsp: workspace summary" },
      () => Promise.race([client.sendRequest<unknown>(SUMMARY_REQUEST, SUMMARY_PARAMS, cancel.token), timeout]));
    } catch (error) {
      cancel.dispose();
      say({ level: "error", text: summaryFailure(error, false) });
      return;
    } finally {
      clearTimeout(timer);
    }
    if (answer === TIMED_OUT) {
      cancel.cancel();
      cancel.dispose();
      say({ level: "warning", text: summaryFailure(undefined, true) });
      return;
    }
    cancel.dispose();
    const folders = (vscode.workspace.workspaceFolders ?? []).map((folder) => folder.uri.fsPath);
    const view = summaryView(answer, folders);
    if (view.kind === "message") {
      say(view);
      return;
    }
    const picked = await vscode.window.showQuickPick<SummaryItem & vscode.QuickPickItem>(view.items, {
      title: view.title,
      placeHolder: view.placeholder,
      matchOnDescription: true,
      matchOnDetail: true,
    });
    if (picked !== undefined) {
      await vscode.window.showTextDocument(client.protocol2CodeConverter.asUri(picked.uri), { preview: false });
    }
  }

  private async connectRemoteWorker(): Promise<void> {
    const config = vscode.workspace.getConfiguration(SECTION);
    const address = await vscode.window.showInputBox({
      title: "kernel-lsp: worker address",
      prompt: "tcp:HOST:PORT (e.g. through `ssh -N -L 7777:127.0.0.1:7777 gpu-host`) or unix:PATH; empty: a local worker",
      placeHolder: "tcp:127.0.0.1:7777",
      value: config.get<string>("worker", ""),
      ignoreFocusOut: true,
      validateInput: workerAddressProblem,
    });
    if (address === undefined) {
      return;
    }
    const target = vscode.workspace.workspaceFolders ? vscode.ConfigurationTarget.Workspace
      : vscode.ConfigurationTarget.Global;
    if (address.trim().startsWith("tcp:")) {
      const tokenFile = await this.pickTokenFile(config.get<string>("workerTokenFile", ""));
      if (tokenFile === undefined) {
        return;
      }
      await config.update("workerTokenFile", tokenFile || undefined, target);
    }
    await config.update("worker", address.trim() || undefined, target);
    await this.pingWorker(address.trim());
  }

  private async pickTokenFile(current: string): Promise<string | undefined> {
    const keep = { label: current ? `Keep ${current}` : "Use $KERNEL_LSP_TOKEN", value: current };
    const env = { label: "Use $KERNEL_LSP_TOKEN of the server's environment", value: "" };
    const choose = { label: "Choose a token file…", value: "?" };
    const picked = await vscode.window.showQuickPick(current ? [keep, env, choose] : [keep, choose],
      { title: "kernel-lsp: token for the TCP worker", ignoreFocusOut: true });
    if (picked === undefined || picked.value !== "?") {
      return picked?.value;
    }
    const files = await vscode.window.showOpenDialog({ canSelectMany: false, openLabel: "Use this token file" });
    return files?.[0]?.fsPath;
  }

  /** Asks the server to reach the worker now; it may take a moment to pull the new `worker` setting first. */
  private async pingWorker(address: string): Promise<void> {
    const expected = address || "local";
    for (let attempt = 0; attempt < 10; attempt++) {
      const status = await this.executeServerCommand(WORKER_STATUS_COMMAND, []);
      if (status === undefined || status === null) {
        return;
      }
      if (status.address === expected) {
        const line = statusLogLine(status as unknown as WorkerStatus, new Date());
        this.workerLog.appendLine(typeof status.pingMs === "number" ? `${line} (ping ${status.pingMs} ms)` : line);
        const ok = status.state === "connected";
        say({ level: ok ? "info" : "error", text: ok
          ? `kernel-lsp: worker ${expected} connected${status.gpu ? ` (${String(status.gpu)})` : ""}`
          : `kernel-lsp: worker ${expected}: ${String(status.message ?? status.state)}` });
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
    say({ level: "warning", text: `kernel-lsp: the server has not taken the worker setting ${expected} yet` });
  }

  private async setApiKey(): Promise<void> {
    const key = await vscode.window.showInputBox({
      title: "kernel-lsp: Anthropic API key",
      prompt: "Kept in VS Code's secret storage and given to the server as $ANTHROPIC_API_KEY (restarts the server)",
      password: true,
      ignoreFocusOut: true,
    });
    if (!key) {
      return;
    }
    await this.context.secrets.store(API_KEY_SECRET, key.trim());
    await this.restart("Anthropic API key set");
  }

  private async clearApiKey(): Promise<void> {
    await this.context.secrets.delete(API_KEY_SECRET);
    await this.restart("Anthropic API key cleared");
  }
}

function say(message: ReturnType<typeof outcomeMessage>): void {
  if (message === undefined) {
    return;
  }
  const show = message.level === "error" ? vscode.window.showErrorMessage
    : message.level === "warning" ? vscode.window.showWarningMessage : vscode.window.showInformationMessage;
  void show(message.text);
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

/** The parts of the Python extension's API used here (ms-python.python, environments API and the older one). */
interface PythonApi {
  environments?: {
    getActiveEnvironmentPath(resource?: vscode.Uri): { path: string };
    resolveEnvironment(path: { path: string } | string): Promise<{ executable: { uri?: vscode.Uri } } | undefined>;
    onDidChangeActiveEnvironmentPath?: vscode.Event<unknown>;
  };
  settings?: { getExecutionDetails(resource?: vscode.Uri): { execCommand: string[] | undefined } };
}

async function pythonExtensionInterpreter(resource: vscode.Uri | undefined,
  log: (message: string) => void): Promise<string | undefined> {
  const python = vscode.extensions.getExtension<PythonApi>(PYTHON_EXTENSION);
  if (python === undefined) {
    return undefined;
  }
  try {
    const api = python.isActive ? python.exports : await python.activate();
    const environments = api?.environments;
    if (environments) {
      const resolved = await environments.resolveEnvironment(environments.getActiveEnvironmentPath(resource));
      const executable = resolved?.executable.uri?.fsPath;
      if (executable) {
        return executable;
      }
    }
    const command = api?.settings?.getExecutionDetails(resource).execCommand;
    return command?.length === 1 ? command[0] : undefined;  // e.g. `conda run ...` is not one interpreter path
  } catch (error) {
    log(`[kernel-lsp] the Python extension gave no interpreter: ${String(error)}`);
    return undefined;
  }
}
