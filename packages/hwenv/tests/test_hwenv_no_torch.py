"""`import hwenv` must not import torch (it installs and imports without torch)."""

import subprocess
import sys


def test_import_does_not_import_torch():
    code = "import sys, hwenv, hwenv.cli, hwenv.testing; print('torch' in sys.modules, 'pytest' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False False", result.stderr
