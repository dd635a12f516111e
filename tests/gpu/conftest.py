"""tests/gpu: its shared module `gpu_marks` is importable by the test files (pytest runs with importlib mode)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
