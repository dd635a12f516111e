"""Generate docs/seed-coverage.md: every seed fact (X1-X18, G1-G17) -> API, example, tests.

Tests declare what they cover with `@pytest.mark.facts("X4", "G8")`; examples declare it in
their first comment line (`# Facts: X4, X5`). This script reads both statically (AST / text,
nothing runs), so the table cannot drift from the tests. A fact with no test is a gap unless
`NOT_TESTABLE_HERE` states why and what is checked instead.

    python tools/seed_coverage.py          # rewrite docs/seed-coverage.md
    python tools/seed_coverage.py --check  # exit 1 if the file is stale or a fact is uncovered
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "seed-coverage.md"
FACTS = [f"X{i}" for i in range(1, 19)] + [f"G{i}" for i in range(1, 18)]

#: The public API that implements each fact (checked to exist by tests/test_seed_coverage.py).
API: dict[str, list[str]] = {
    "X1": ["hwenv.detect", "hwenv.diagnose"],
    "X2": ["hwenv.diagnose"],
    "X3": ["hwenv.detect"],
    "X4": ["hwenv.select", "hwenv.parse_affinity_mask", "hwdist.launch_command"],
    "X5": ["hwenv.select"],
    "X6": ["hwattn.resolve_attention", "hwattn.sdpa"],
    "X7": ["hwattn.resolve_attention"],
    "X8": ["hwattn.resolve_attention"],
    "X9": ["hwrun.plan", "hwrun.pipeline"],
    "X10": ["hwrun.generate"],
    "X11": ["hwrun.generate"],
    "X12": ["hwattn.kernel_plan", "hwattn.load_kwargs"],
    "X13": ["hwattn.kernel_mapping"],
    "X14": ["hwrun.plan"],
    "X15": ["hwrun.train"],
    "X16": ["hwrun.training_arguments"],
    "X17": ["hwrun.training_arguments", "hwrun.plan"],
    "X18": ["hwdist.backend_for", "hwdist.launch_command"],
    "G1": ["hwenv.detect"],
    "G2": ["hwcompile.compile", "hwenv.diagnose"],
    "G3": ["hwenv.diagnose", "hwenv.accelerate_sees_gaudi"],
    "G4": ["hwenv.select", "hwrun.plan"],
    "G5": ["hwenv.diagnose"],
    "G6": ["hwenv.select", "hwenv.current_selection"],
    "G7": ["hwenv.parse_hl_smi_csv", "hwenv.read_hl_smi"],
    "G8": ["hwenv.check_group", "hwdist.init"],
    "G9": ["hwrun.plan", "hwrun.pipeline"],
    "G10": ["hwrun.plan"],
    "G11": ["hwrun.train"],
    "G12": ["hwenv.detect", "hwrun.training_arguments"],
    "G13": ["hwcompile.route_backend", "hwcompile.patch_torch_compile"],
    "G14": ["hwcompile.training_arguments"],
    "G15": ["hwdist.backend_for"],
    "G16": ["hwdist.launch_command"],
    "G17": [],
}

#: Facts that need the real hardware or software to exercise, with what is checked instead.
NOT_TESTABLE_HERE: dict[str, str] = {
    "X1": "installing torch from the XPU index needs that index; checked: detection reports a torch without an XPU backend",
    "X2": "the Intel GPU driver and xpu-smi are not here; checked: doctor flags xpu-smi present with a torch lacking XPU",
    "X5": "real Level Zero enumeration order needs Intel GPUs; checked: every XPU selection sets ZE_ENABLE_PCI_ID_DEVICE_ORDER=1",
    "X11": "XPU graphs need an Intel GPU; checked: continuous batching runs through Transformers' API on CPU and matches static batching",
    "G17": "Optimum for Intel Gaudi is a separate project hwstack does not wrap; nothing to check",
}

#: What each fact is held to: a real run (CPU here, or the H200 by tests/gpu), a real source read
#: by a test (installed torch/transformers/accelerate, the gaudi bridge manifest, the Level Zero
#: spec's tables), or only a fake of hwenv.testing. docs/intel-fidelity.md has the Intel rows.
CHECKED_AGAINST: dict[str, str] = {
    "X1": "real: this CPU build of torch (no XPU backend) is reported; an XPU itself only through fake_xpu",
    "X2": "fake only: an xpu-smi on PATH and an Intel render node are faked",
    "X3": "source: fake_xpu's functions run torch/xpu's own Python (drift test); counts vs the Level Zero spec",
    "X4": "source: Level Zero spec mask grammar and FLAT/COMPOSITE tables; real: the child environment of hwenv exec / hwdist launch",
    "X5": "source: Level Zero spec (the mask never reorders enumeration); real enumeration needs Intel GPUs",
    "X6": "real: SDPA with enable_gqa against eager on CPU tensors; source: Transformers' use_gqa_in_sdpa rule",
    "X7": "source: the installed Transformers' hub-kernel table; the kernel download itself is not made",
    "X8": "source: the installed Transformers' FA3/FA4 checks; real: sm90 on the H200",
    "X9": "real: plans from safetensors headers; device memory only from fake_xpu",
    "X10": "real: generation on CPU and on the H200 (tests/gpu)",
    "X11": "real: continuous batching on CPU and hwrun's slot decoder on the H200; XPU graphs only on fakes",
    "X12": "source: the installed Transformers' KernelConfig and default mapping; kernels are not downloaded",
    "X13": "source: the installed Transformers' KernelConfig; kernels are not downloaded",
    "X14": "source: bitsandbytes 0.50's registered backends; real: 4-bit on CPU",
    "X15": "real: QLoRA on CPU (and on the H200 in the train benchmark)",
    "X16": "source: the installed Transformers/Accelerate device chain run against fake_xpu (torch.accelerator faked)",
    "X17": "source: torch's is_bf16_supported body run on fake_xpu: True on every available XPU, so Transformers accepts emulated bf16",
    "X18": "source: XCCL in release XPU wheels from torch 2.8; real: gloo on CPU, NCCL on the H200; xccl only on fakes",
    "G1": "fake only: held to the public bridge 1.19's names and signatures by a manifest drift test",
    "G2": "source: the bridge's PT_HPU_LAZY_MODE parsing and default by version; execution only on fake_gaudi",
    "G3": "source: Transformers' Accelerate gate run against fake_gaudi",
    "G4": "source: the bridge's env_flags.yaml (int64 only in eager mode, Gaudi2+)",
    "G5": "source: Transformers' is_torch_hpu_available run against fake_gaudi with Accelerate versions overridden",
    "G6": "source: Intel's Gaudi docs; hl-smi only faked",
    "G7": "source: Intel's sample CSV; hl-smi only faked",
    "G8": "source: Intel's partial-server group table and single-card instructions",
    "G9": "real: plans on CPU; a Gaudi only through fake_gaudi",
    "G10": "source: the Gaudi generation table; bitsandbytes on Gaudi only through fakes",
    "G11": "real: QLoRA on CPU; Gaudi only through fakes",
    "G12": "source: Transformers' TrainingArguments device chain run against fake_gaudi",
    "G13": "source: Transformers' real hpu_backend_compile wrapper run against fake_gaudi, in both orders with hwcompile",
    "G14": "source: TrainingArguments' hpu_backend default run against fake_gaudi",
    "G15": "source: the bridge's hccl registration module; collectives only through fakes",
    "G16": "real: torchrun launches with gloo on CPU; Gaudi counts from fake_gaudi",
    "G17": "nothing to check",
}

MARKER = re.compile(r"^\s*#\s*Facts:\s*(.+)$", re.MULTILINE)


def _fact_args(decorator: ast.expr) -> list[str]:
    if not isinstance(decorator, ast.Call):
        return []
    func = decorator.func
    if not (isinstance(func, ast.Attribute) and func.attr == "facts"):
        return []
    return [a.value for a in decorator.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def test_markers() -> dict[str, list[str]]:
    """fact -> ["path::test_name", ...] from every `@pytest.mark.facts(...)` in the workspace's tests."""
    found: dict[str, list[str]] = {fact: [] for fact in FACTS}
    paths = sorted(ROOT.glob("packages/*/tests/**/*.py")) + sorted(ROOT.glob("tests/**/*.py"))
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for decorator in node.decorator_list:
                    for fact in _fact_args(decorator):
                        if fact not in found:
                            raise SystemExit(f"{path}: unknown fact id {fact!r} in @pytest.mark.facts")
                        found[fact].append(f"{path.relative_to(ROOT)}::{node.name}")
    return found


def example_markers() -> dict[str, list[str]]:
    """fact -> ["examples/x.py", ...] from each example's `# Facts: ...` comment."""
    found: dict[str, list[str]] = {fact: [] for fact in FACTS}
    for path in sorted((ROOT / "examples").glob("*")):
        if path.suffix not in (".py", ".sh"):
            continue
        match = MARKER.search(path.read_text())
        if match:
            for fact in re.findall(r"[XG]\d+", match.group(1)):
                if fact in found:
                    found[fact].append(str(path.relative_to(ROOT)))
    return found


def gaps() -> list[str]:
    """Facts no test covers and no reason excuses."""
    tests = test_markers()
    return [fact for fact in FACTS if not tests[fact] and fact not in NOT_TESTABLE_HERE]


def render() -> str:
    tests, examples = test_markers(), example_markers()
    lines = [
        "# Seed coverage",
        "",
        "Every fact of the seeds (`shared/FACTS.md`) → the hwstack API that implements it, the example that",
        "shows it, and the tests that check it. Generated by `python tools/seed_coverage.py` from the",
        "`@pytest.mark.facts(...)` markers in the tests and the `# Facts:` line of each example;",
        "`tests/test_seed_coverage.py` fails when this file is stale or a fact has no test and no stated reason.",
        "",
        "The column *checked against* says whether a fact is held to a real run, a real source (read by a",
        "test), or only to a fake; `docs/intel-fidelity.md` lists every real Intel behaviour with its test.",
        "",
        "| fact | API | examples | tests | checked against | without the hardware |",
        "|---|---|---|---|---|---|",
    ]
    for fact in FACTS:
        api = ", ".join(f"`{name}`" for name in API[fact]) or "—"
        ex = ", ".join(f"`{e}`" for e in examples[fact]) or "—"
        covered = tests[fact]
        if covered:
            test_cell = f"{len(covered)}: " + ", ".join(f"`{t.split('::')[-1]}`" for t in covered[:4])
        else:
            test_cell = "none: see the last column" if fact in NOT_TESTABLE_HERE else "**gap**"
        if len(covered) > 4:
            test_cell += f" (+{len(covered) - 4} more)"
        lines.append(f"| {fact} | {api} | {ex} | {test_cell} | {CHECKED_AGAINST[fact]} | {NOT_TESTABLE_HERE.get(fact, '')} |")
    missing = gaps()
    lines += ["", f"Gaps (no test, no stated reason): {', '.join(missing) if missing else 'none'}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = not OUTPUT.exists() or OUTPUT.read_text() != text
        if stale:
            print("docs/seed-coverage.md is stale: run python tools/seed_coverage.py", file=sys.stderr)
        if gaps():
            print(f"uncovered facts: {gaps()}", file=sys.stderr)
        return 1 if stale or gaps() else 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}; gaps: {gaps() or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
