"""The calibration profile's types live in the bottom package: reading its schema costs neither the fit nor the
simulator (numpy, scipy, servelab.perf, servelab.sim)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("numpy", "scipy", "servelab.perf", "servelab.sim", "servelab.targets")


def test_the_profile_schema_imports_nothing_heavy() -> None:
    probe = (
        "import sys\n"
        "from servelab.cli.schema import json_schema\n"
        "json_schema('profile')\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
