// package.json against the code: every command registered, every setting described, no secret as a plain setting.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";

import { DOCUMENT_COMMANDS, EXTENSION_COMMANDS } from "../src/pure/commands";
import { CLIENT_ONLY_KEYS, LAUNCH_SETTINGS, SECTION } from "../src/pure/settings";

const root = path.resolve(__dirname, "..", "..");
const manifest = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8"));
const properties: Record<string, Record<string, unknown>> = manifest.contributes.configuration.properties;

test("the contributed commands are the ones the extension registers", () => {
  const contributed = manifest.contributes.commands.map((c: { command: string }) => c.command);
  assert.deepEqual([...contributed].sort(), [...EXTENSION_COMMANDS].sort());
  assert.deepEqual(Object.values(DOCUMENT_COMMANDS), ["kernel-lsp.verify", "kernel-lsp.profile", "kernel-lsp.optimize",
    "kernel-lsp.sanitize"]);
});

test("every setting has a description and a default, under the server's section", () => {
  for (const [key, schema] of Object.entries(properties)) {
    assert.ok(key.startsWith(`${SECTION}.`), key);
    assert.ok(schema.description || schema.markdownDescription, `${key} has no description`);
    assert.ok("default" in schema, `${key} has no default`);
  }
  for (const setting of LAUNCH_SETTINGS) {
    assert.ok(setting in properties, setting);
  }
  const clientOnly = Object.keys(properties).filter((key) => key.split(".").length > 2);
  assert.ok(clientOnly.every((key) => CLIENT_ONLY_KEYS.includes(key.split(".")[1])), clientOnly.join(", "));
});

test("the API key is a secret, never a plain setting", () => {
  assert.equal(`${SECTION}.anthropicApiKey` in properties, false);
  assert.ok(EXTENSION_COMMANDS.includes("kernelLsp.setAnthropicApiKey"));
});

test("the bundle is what the manifest points at", () => {
  assert.equal(manifest.main, "./dist/extension.js");
  assert.ok(manifest.activationEvents.includes("onLanguage:cuda-cpp"));
});
