"""process/confine.py in a throw-away child: what a confined candidate's process can and cannot do here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from kernel_lsp.process.confine import landlock_abi


def probe() -> dict:
    result = subprocess.run([sys.executable, "-m", "kernel_lsp.process.confine", "--probe"], capture_output=True,
                            text=True, timeout=60, check=True)
    seen = json.loads(result.stdout)
    for folder in seen["folders"]:
        shutil.rmtree(folder, ignore_errors=True)
    return seen


def test_network_is_refused():
    seen = probe()
    assert seen["confinement"]["network"].startswith("isolated"), seen
    assert seen["connect"] == "EACCES"  # to a listener on this machine, opened before the confinement


def test_writes_stay_in_the_scratch_folder():
    if landlock_abi() < 1:
        pytest.skip("Landlock is not available in this kernel: files cannot be confined here")
    seen = probe()
    assert seen["confinement"]["files"].startswith("isolated"), seen
    assert (seen["write outside"], seen["write inside"]) == ("EACCES", "done")


def test_confinement_says_what_it_could_not_do(monkeypatch: pytest.MonkeyPatch):
    from kernel_lsp.process import confine

    monkeypatch.setattr(confine, "landlock_abi", lambda: 0)  # a kernel without Landlock
    status = confine._restrict_writes(["/tmp"], confine.landlock_abi())
    assert status.startswith("not isolated") and "Landlock" in status
