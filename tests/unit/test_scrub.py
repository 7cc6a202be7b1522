"""findings.scrub: what a candidate raised or printed reaches a finding and the model without any credential in it,
and bounded; ordinary compiler and runtime messages pass unchanged."""

from __future__ import annotations

import json
import secrets
import string
from pathlib import Path

import pytest

from kernel_lsp.agent.loop import tool_result_block
from kernel_lsp.agent.tools import ToolResult
from kernel_lsp.findings import (
    MESSAGE_LIMIT,
    REDACTED,
    Finding,
    Range,
    Related,
    Severity,
    register_secret,
    scrub,
    secrets_held,
)
from tests.paths import FIXTURES

TESTS = Path(__file__).resolve().parents[1]


def random_text(count: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(count))


def finding(message: str, related: tuple[Related, ...] = ()) -> Finding:
    return Finding("file:///home/user/candidate.py", Range.line(3), Severity.ERROR, "kernel-lsp",
                   "run-python-exception", message, related)


ANTHROPIC = "sk-ant-api03-" + random_text(40)
OPENAI = "sk-proj-" + random_text(40)
GITHUB = [prefix + random_text(36) for prefix in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")] + [
    "github_pat_11ABCDEFG0" + random_text(40, string.ascii_letters + string.digits + "_")]
AWS = "AKIA" + random_text(16, string.ascii_uppercase + string.digits)
SLACK = "xoxb-" + random_text(12, string.digits) + "-" + random_text(24)
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA" + random_text(60) + "\n" + random_text(64) +
       "\n-----END RSA PRIVATE KEY-----")


@pytest.mark.parametrize("secret", [ANTHROPIC, OPENAI, *GITHUB, AWS, SLACK, PEM],
                         ids=["anthropic", "openai", "ghp", "gho", "ghu", "ghs", "ghr", "github-pat", "aws", "slack",
                              "pem"])
def test_each_credential_shape_is_redacted(secret: str):
    text = f"RuntimeError: could not reach the service with {secret} (status 401)"
    scrubbed = scrub(text)
    assert secret not in scrubbed and REDACTED in scrubbed
    assert scrubbed.startswith("RuntimeError: could not reach the service with ")
    assert scrubbed.endswith(" (status 401)")


@pytest.mark.parametrize("text, expected", [
    ("Authorization: Bearer abc.DEF-ghi_123456", "Authorization: Bearer [redacted]"),
    ("curl -H 'Bearer eyJhbGciOiJIUzI1NiJ9'", "curl -H 'Bearer [redacted]'"),
    ("MY_SERVICE_TOKEN=abcdefghij", "MY_SERVICE_TOKEN=[redacted]"),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY next",
     "AWS_SECRET_ACCESS_KEY=[redacted] next"),
    ('{"api_key": "abcdef123456", "tokens": 5}', '{"api_key": "[redacted]", "tokens": 5}'),
    ("{'db_password': 'correct-horse'}", "{'db_password': '[redacted]'}"),
    ("password: hunter22x", "password: [redacted]"),
    ("x-auth-token: 9f8e7d6c5b4a", "x-auth-token: [redacted]"),
    ("session_cookie=a1b2c3d4e5f6g7", "session_cookie=[redacted]"),
    ("--client-secret=s3cr3tvalue1", "--client-secret=[redacted]"),
    ("postgres://admin:pa55word@db.internal:5432/x", "postgres://admin:[redacted]@db.internal:5432/x"),
])
def test_credential_assignments_keep_their_name(text: str, expected: str):
    assert scrub(text) == expected


def test_a_planted_key_in_an_exception_comes_out_of_the_finding_redacted(monkeypatch):
    key = "sk-ant-api03-" + random_text(40)
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    try:  # what a candidate that read the key would raise
        raise RuntimeError(f"exfiltrating {key[:-1]}{key[-1]} via the error message")
    except RuntimeError as exc:
        made = finding(f"{type(exc).__name__}: {exc}")
    assert key not in made.message and made.message == f"RuntimeError: exfiltrating {REDACTED} via the error message"
    assert key not in json.dumps(made.to_dict())
    assert key not in Finding.from_dict({**made.to_dict(), "message": f"again {key}"}).message


def test_exact_values_are_redacted_whatever_their_shape(monkeypatch):
    plain = "plain-words-" + random_text(8, string.ascii_lowercase)  # no credential shape at all
    monkeypatch.setenv("SOME_SERVICE_TOKEN", plain)
    assert scrub(f"printed: {plain}!") == f"printed: {REDACTED}!"
    registered = "unshaped" + random_text(12, string.ascii_lowercase)
    register_secret(registered)
    assert registered not in finding(f"value {registered}").message
    held = "held-" + random_text(20, string.ascii_lowercase)  # taken out of os.environ by the command, still known
    monkeypatch.setenv("KERNEL_LSP_TOKEN", held)
    with secrets_held():
        assert scrub(f"token {held}") == f"token {REDACTED}"


def test_related_messages_are_scrubbed_too():
    made = finding("crashed", (Related("file:///x.py", Range.line(1), f"called with {ANTHROPIC}"),))
    assert made.related[0].message == f"called with {REDACTED}"


@pytest.mark.parametrize("message", [
    "error: identifier \"key_states\" is undefined",
    "KeyError: 'weight_123456'",
    "KeyboardInterrupt: stopped after 12345678 steps",
    "ZeroDivisionError: division by zero",
    "num_key_value_heads = 8; key_len = 64",
    "key_states = self.k_proj(hidden_states)",
    "ptxas info    : Used 32 registers, 384 bytes smem, 400 bytes cmem[0]",
    "the budget of 100,000 tokens is spent (123456 used)",
    "error: argument of type \"const char *\" is incompatible with parameter of type \"int\"",
    ("cache key 9f86d081884c7d659a2feaea0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a0 in "
     "/home/user/.cache/kernel-lsp/builds/torch_extensions/kl_add_one/kl_add_one.so"),
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "/tmp/pytest-of-user/pytest-3/test_token_file0/w.sock.token",
    "RuntimeError: CUDA error: an illegal memory access was encountered at task-1234567890abcdefghij",
    '{"missing-key": "the API key is missing", "auth": "the model API refused the API key"}',
])
def test_ordinary_messages_hashes_and_paths_pass_unchanged(message: str):
    assert scrub(message) == message
    assert finding(message).message == message


def test_recorded_tool_output_passes_unchanged():
    """Every line of the recorded nvcc, ptxas, ncu and compute-sanitizer output and the KernelBench sources."""
    folders = (FIXTURES, TESTS / "fixtures" / "sanitizer", TESTS / "fixtures" / "kernelbench")
    files = [p for folder in folders for p in folder.rglob("*")
             if p.is_file() and p.suffix in (".txt", ".log", ".csv", ".cu", ".py")]
    assert len(files) > 20
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            assert scrub(line, limit=None) == line, (path, line)


def test_the_length_is_bounded_keeping_the_head():
    text = "Traceback (most recent call last):\n" + "x" * 100_000 + ANTHROPIC
    scrubbed = scrub(text)
    assert len(scrubbed) <= MESSAGE_LIMIT and scrubbed.startswith("Traceback (most recent call last):\nxxx")
    cut = int(scrubbed.rsplit("[... ", 1)[1].split(" characters cut]")[0])
    assert scrubbed.endswith(" characters cut]") and 100_000 - MESSAGE_LIMIT < cut <= len(text)
    assert scrub(scrubbed) == scrubbed  # scrubbing again changes nothing (dataclasses.replace makes findings again)
    assert len(finding(text).message) <= MESSAGE_LIMIT
    assert len(scrub("y" * 50, limit=40)) <= 40 and scrub("y" * 40, limit=40) == "y" * 40
    assert scrub("z" * 50, limit=None) == "z" * 50


def test_tool_results_reach_the_model_scrubbed():
    printed = json.dumps({"verdict": "crashed", "printed": f"env: ANTHROPIC_API_KEY={ANTHROPIC}\n{PEM}\" tail"})
    block = tool_result_block({"id": "toolu_1"}, ToolResult(printed))
    assert ANTHROPIC not in block["content"] and "PRIVATE KEY" not in block["content"]
    assert json.loads(block["content"])["verdict"] == "crashed"  # still the JSON the model reads
    long = json.dumps({"source": "x" * 50_000})  # a long tool result (a source read back) is not cut
    assert tool_result_block({"id": "toolu_2"}, ToolResult(long))["content"] == long
