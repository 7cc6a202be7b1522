// The server's `worker` setting: empty (a local worker), unix:PATH or tcp:HOST:PORT (kernel_lsp/worker/client.py).

/** Why `value` is not a worker address the server accepts, or undefined when it is. */
export function workerAddressProblem(value: string): string | undefined {
  const address = value.trim();
  if (address === "") {
    return undefined;
  }
  if (address.startsWith("unix:")) {
    return address.length > 5 ? undefined : "unix: needs the socket's path, e.g. unix:/run/kernel-lsp/worker.sock";
  }
  if (address.startsWith("tcp:")) {
    const rest = address.slice(4);
    const colon = rest.lastIndexOf(":");
    const host = colon > 0 ? rest.slice(0, colon) : "";
    const port = colon > 0 ? rest.slice(colon + 1) : "";
    if (!host || !/^\d+$/.test(port) || Number(port) < 1 || Number(port) > 65535) {
      return "expected tcp:HOST:PORT, e.g. tcp:127.0.0.1:7777 (through `ssh -N -L 7777:127.0.0.1:7777 gpu-host`)";
    }
    return undefined;
  }
  return "expected unix:PATH or tcp:HOST:PORT (empty: a local worker)";
}
