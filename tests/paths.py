"""Where the tests' recorded inputs live: in the repository (tests/fixtures), copied from the project's shared folder.

- fixtures/h200: real tool output recorded on an H200 (KERNEL_LSP_FIXTURES names another copy);
- fixtures/kernelbench: the KernelBench problems (MIT, LICENSE beside them; KERNEL_LSP_KERNELBENCH names another);
- fixtures/reports: VerifyReports the judge returned here, on the CPU (an honest Triton ReLU, and one rejected for
  mutating its input), as the sandbox's pipe carried them.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = Path(os.environ.get("KERNEL_LSP_FIXTURES", HERE / "fixtures" / "h200"))
KERNELBENCH = Path(os.environ.get("KERNEL_LSP_KERNELBENCH", HERE / "fixtures" / "kernelbench"))
REPORTS = HERE / "fixtures" / "reports"
