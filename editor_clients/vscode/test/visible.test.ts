import assert from "node:assert/strict";
import { test } from "node:test";

import { ShownDocument, Timers, VisibleDocuments, VisibleDocumentsSender, sameVisibleDocuments, visibleDocuments }
  from "../src/pure/visible";

const file = (uri: string): ShownDocument => ({ scheme: "file", uri });

test("the payload: file documents only, each once, the visible ones sorted", () => {
  const a = file("file:///w/a.cu");
  const b = file("file:///w/b.py");
  const output = { scheme: "output", uri: "output:kernel-lsp" };
  const untitled = { scheme: "untitled", uri: "untitled:Untitled-1" };
  assert.deepEqual(visibleDocuments(b, [b, output, a, b, untitled]),
    { active: "file:///w/b.py", visible: ["file:///w/a.cu", "file:///w/b.py"] });
  assert.deepEqual(visibleDocuments(output, [output]), { active: null, visible: [] });
  assert.deepEqual(visibleDocuments(undefined, []), { active: null, visible: [] });
  assert.deepEqual(visibleDocuments(untitled, [a]), { active: null, visible: ["file:///w/a.cu"] });
});

test("payloads compare by the active URI and the visible list", () => {
  const one: VisibleDocuments = { active: "file:///a", visible: ["file:///a", "file:///b"] };
  assert.equal(sameVisibleDocuments(undefined, one), false);
  assert.equal(sameVisibleDocuments({ ...one, visible: [...one.visible] }, one), true);
  assert.equal(sameVisibleDocuments({ ...one, active: null }, one), false);
  assert.equal(sameVisibleDocuments({ ...one, visible: ["file:///a"] }, one), false);
  assert.equal(sameVisibleDocuments({ ...one, visible: ["file:///a", "file:///c"] }, one), false);
});

/** Timers that fire only when the test says so. */
function manualTimers(): Timers & { fire(): void; waiting(): number[] } {
  let next = 1;
  const pending = new Map<number, { callback: () => void; ms: number }>();
  return {
    setTimeout: (callback, ms) => {
      pending.set(next, { callback, ms });
      return next++;
    },
    clearTimeout: (handle) => void pending.delete(handle as number),
    fire: () => {
      const due = [...pending.values()];
      pending.clear();
      due.forEach(({ callback }) => callback());
    },
    waiting: () => [...pending.values()].map(({ ms }) => ms),
  };
}

test("a burst of changes is sent once, after the delay, and an unchanged payload not again", () => {
  const timers = manualTimers();
  const sent: VisibleDocuments[] = [];
  let current: VisibleDocuments | undefined = { active: "file:///a", visible: ["file:///a"] };
  const sender = new VisibleDocumentsSender((params) => sent.push(params), () => current, 150, timers);
  sender.changed();
  sender.changed();
  sender.changed();
  assert.deepEqual(timers.waiting(), [150]);  // each change restarted the one delay
  assert.equal(sent.length, 0);
  timers.fire();
  assert.deepEqual(sent, [{ active: "file:///a", visible: ["file:///a"] }]);
  sender.changed();  // e.g. focus moved to the panel and back: the same documents
  timers.fire();
  assert.equal(sent.length, 1);
  current = { active: "file:///b", visible: ["file:///a", "file:///b"] };
  sender.changed();
  timers.fire();
  assert.equal(sent.length, 2);
  assert.deepEqual(sent[1], current);
});

test("no server: nothing sent; a new server is told again at once", () => {
  const timers = manualTimers();
  const sent: VisibleDocuments[] = [];
  let running = false;
  const payload = { active: "file:///a", visible: ["file:///a"] };
  const sender = new VisibleDocumentsSender((params) => sent.push(params), () => (running ? payload : undefined),
    150, timers);
  sender.changed();
  timers.fire();
  assert.equal(sent.length, 0);
  running = true;
  sender.flush();
  sender.flush();
  assert.equal(sent.length, 1);
  sender.changed();
  sender.reset();  // the server restarted: the pending send is dropped, and the same payload goes out again
  assert.deepEqual(timers.waiting(), []);
  sender.flush();
  assert.equal(sent.length, 2);
});
