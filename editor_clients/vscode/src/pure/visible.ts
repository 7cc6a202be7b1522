// kernelLsp/visibleDocuments: which documents the user looks at, so the server checks those first (the active one,
// then the visible ones, then other open ones, then closed workspace files).

export const VISIBLE_NOTIFICATION = "kernelLsp/visibleDocuments";
export const VISIBLE_DEBOUNCE_MS = 150;

/** The notification's params: URIs as the client sends them in didOpen (its code2Protocol converter). */
export interface VisibleDocuments {
  active: string | null;
  visible: string[];
}

/** A document an editor shows: its URI's scheme, and its URI as the server knows it. */
export interface ShownDocument {
  scheme: string;
  uri: string;
}

/**
 * The params for the active editor's document and the visible editors' documents: only `file:` documents (not
 * output channels, untitled buffers, diff views of git objects), each once, the visible ones sorted so that the
 * same set of editors always gives the same params.
 */
export function visibleDocuments(active: ShownDocument | undefined,
  visible: readonly ShownDocument[]): VisibleDocuments {
  const isFile = (document: ShownDocument) => document.scheme === "file";
  const uris = new Set(visible.filter(isFile).map((document) => document.uri));
  return {
    active: active !== undefined && isFile(active) ? active.uri : null,
    visible: [...uris].sort(),
  };
}

export function sameVisibleDocuments(a: VisibleDocuments | undefined, b: VisibleDocuments): boolean {
  return a !== undefined && a.active === b.active && a.visible.length === b.visible.length
    && a.visible.every((uri, index) => uri === b.visible[index]);
}

export interface Timers {
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const realTimers: Timers = {
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
};

/**
 * Sends the params `delayMs` after the last change (editors switch in bursts: a split, a closed group), and only
 * when they differ from what this server was last sent. `reset` forgets that, for a server started anew.
 */
export class VisibleDocumentsSender {
  private pending: unknown;
  private last: VisibleDocuments | undefined;

  constructor(private readonly send: (params: VisibleDocuments) => void,
    private readonly read: () => VisibleDocuments | undefined,
    private readonly delayMs = VISIBLE_DEBOUNCE_MS, private readonly timers: Timers = realTimers) {}

  /** Something changed: read and send after the delay (a change meanwhile starts the delay again). */
  changed(): void {
    this.cancel();
    this.pending = this.timers.setTimeout(() => {
      this.pending = undefined;
      this.flush();
    }, this.delayMs);
  }

  /** Reads and sends now (when the server has just started); nothing when `read` gives nothing (no server). */
  flush(): void {
    const params = this.read();
    if (params === undefined || sameVisibleDocuments(this.last, params)) {
      return;
    }
    this.last = params;
    this.send(params);
  }

  /** A new server: it has been told nothing yet. */
  reset(): void {
    this.cancel();
    this.last = undefined;
  }

  cancel(): void {
    if (this.pending !== undefined) {
      this.timers.clearTimeout(this.pending);
      this.pending = undefined;
    }
  }
}
