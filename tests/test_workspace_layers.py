"""Workspace rules: the layer rule (only hwenv touches torch.xpu / torch.hpu / habana_frameworks),
dependency direction, sibling version ranges, and the locked library window."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["hwenv", "hwattn", "hwcompile", "hwdist", "hwrun"]
#: Allowed direction: a package may depend on the ones listed (never upwards).
ALLOWED_DEPENDENCIES = {
    "hwenv": set(),
    "hwattn": {"hwenv"},
    "hwcompile": {"hwenv"},
    "hwdist": {"hwenv"},
    "hwrun": {"hwenv", "hwattn", "hwcompile", "hwdist"},
}
FORBIDDEN = re.compile(r"torch\.xpu\b|torch\.hpu\b|habana_frameworks")
#: (package-relative path, pattern) -> why the direct use is needed. Keep this short.
ALLOW_LIST: dict[tuple[str, str], str] = {
    ("hwdist", "habana_frameworks.torch.distributed.hccl"):
        "importing it registers the HCCL process-group backend (G15); nothing else can",
    ("hwcompile", "habana_frameworks.torch"):
        "importing the Gaudi plugin registers the 'hpu_backend' torch.compile backend (G13)",
}


def _source_files(package: str):
    yield from (ROOT / "packages" / package / "src").rglob("*.py")


def _code_lines(path: Path):
    in_docstring = False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        quotes = stripped.count('"""') + stripped.count("'''")
        if in_docstring or stripped.startswith(('"""', "'''")):
            if quotes % 2 == 1:
                in_docstring = not in_docstring
            continue
        code = line.split("#", 1)[0]
        yield number, code


def test_only_hwenv_touches_intel_device_modules():
    offences = []
    for package in PACKAGES[1:]:
        allowed = [pattern for (owner, pattern) in ALLOW_LIST if owner == package]
        for path in _source_files(package):
            for number, code in _code_lines(path):
                for match in FORBIDDEN.finditer(code):
                    rest = code[match.start():]
                    if any(rest.startswith(pattern) or pattern in code for pattern in allowed):
                        continue
                    offences.append(f"{path.relative_to(ROOT)}:{number}: {code.strip()}")
    assert not offences, "go through hwenv instead (or add to ALLOW_LIST with a reason):\n" + "\n".join(offences)


def test_layer_rule_catches_a_violation(tmp_path):
    sample = tmp_path / "bad.py"
    sample.write_text('"""doc mentioning torch.xpu is fine"""\nimport torch\nx = torch.xpu.device_count()  # bad\n')
    hits = [code for _, code in _code_lines(sample) if FORBIDDEN.search(code)]
    assert hits == ["x = torch.xpu.device_count()  "]


def _pyproject(package: str) -> dict:
    return tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0]


def test_dependency_direction_never_points_up():
    for package in PACKAGES:
        deps = {_requirement_name(r) for r in _pyproject(package)["project"].get("dependencies", [])}
        siblings = deps & set(PACKAGES)
        assert siblings <= ALLOWED_DEPENDENCIES[package], (package, siblings)
        assert "torch" not in deps or package != "hwenv"
    assert _pyproject("hwenv")["project"]["dependencies"] == []


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _admits(spec: str, version: str) -> bool:
    value = _version_tuple(version)
    for clause in spec.split(","):
        match = re.fullmatch(r"\s*(>=|<=|<|>|==)\s*([\d.]+)\s*", clause)
        assert match, f"unsupported specifier {clause!r}"
        op, bound = match.group(1), _version_tuple(match.group(2))
        width = max(len(value), len(bound))
        a, b = value + (0,) * (width - len(value)), bound + (0,) * (width - len(bound))
        if not {">=": a >= b, "<=": a <= b, "<": a < b, ">": a > b, "==": a == b}[op]:
            return False
    return True


def test_every_sibling_range_admits_the_siblings_current_version():
    versions = {p: _pyproject(p)["project"]["version"] for p in PACKAGES}
    for package in PACKAGES:
        for requirement in _pyproject(package)["project"].get("dependencies", []):
            name = _requirement_name(requirement)
            if name in PACKAGES:
                spec = requirement[len(name):]
                assert spec.strip(), f"{package} needs a version range on {name}"
                assert "<" in spec, f"{package}: {requirement} needs an upper bound"
                assert _admits(spec, versions[name]), f"{package}: {requirement} excludes {name} {versions[name]}"


def test_range_checker_can_fail():
    assert not _admits(">=0.1,<0.2", "0.2.0") and _admits(">=0.1,<0.2", "0.1.5")


def test_locked_transformers_accepts_the_installed_kernels():
    """LIBRARIES.md: transformers only sees a kernels inside its window; ours must be inside."""
    import kernels
    import transformers
    from transformers.utils import is_kernels_available

    assert is_kernels_available() is True, (transformers.__version__, kernels.__version__)
    lock = (ROOT / "uv.lock").read_text()
    assert re.search(r'name = "transformers"\nversion = "5\.2[2-5]\.', lock), "transformers must stay >=5.22.2,<5.26"


def test_declared_ranges_admit_the_oldest_and_newest_tested_pairs():
    """The ranges hwattn and hwrun declare are the ones CI tests: the lock (newest) and .ci/run's oldest pair."""
    from packaging.requirements import Requirement

    ci = (ROOT / ".ci" / "run").read_text()
    oldest = dict(re.findall(r"--with (transformers|kernels)==([\d.]+)", ci))
    assert set(oldest) == {"transformers", "kernels"}, "CI must run the oldest supported pair"
    lock = (ROOT / "uv.lock").read_text()
    newest = {name: re.search(rf'name = "{name}"\nversion = "([^"]+)"', lock).group(1) for name in oldest}
    for package in ("hwattn", "hwrun"):
        text = (ROOT / "packages" / package / "pyproject.toml").read_text()
        for line in re.findall(r'"((?:transformers|kernels)[^"]*)"', text):
            requirement = Requirement(line)
            for version in (oldest[requirement.name], newest[requirement.name]):
                assert requirement.specifier.contains(version), f"{package}: {line} refuses {version}"
    assert re.search(r'requires-python = ">=3\.11"', (ROOT / "pyproject.toml").read_text())
