"""When Transformers reaches for Hub kernels by itself, and offline (issue 41.9), against the installed sources.

transformers 5.25 `modeling_utils.py` `from_pretrained` (`use_kernels` absent -> True unless `USE_HUB_KERNELS` is
off, then `set_use_kernels` -> `kernelize`), `integrations/hub_kernels.py` (`_kernels_enabled`,
`_build_kernel_mapping`), kernels 0.19 `_internals/_versions.py` (`resolve_version_spec_as_ref`: offline, a version
missing from `<cache>/kernels--org--name/refs/vN` raises "Version N of '<repo>' is not available in the local
cache"), `_internals/load.py` (`local_files_only=constants.HF_HUB_OFFLINE`). On 2026-12-06 a plain Trainer run and
`transformers serve` died offline with exactly that for `kernels-community/rotary` version 2 (INTEL.md, round two).
"""

from __future__ import annotations

import hwenv
import pytest
from hwenv.hub_kernels import DEFAULT_KERNEL_REPOS, HUB_KERNEL_DEVICE_TYPES, cache_dir


def _transformers_mapping() -> dict[str, tuple[int, set[str]]]:
    from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

    repos: dict[str, tuple[int, set[str]]] = {}
    for devices in get_kernel_mapping_transformers().values():
        for device, repositories in devices.items():
            kind = getattr(device, "type", device)
            for repository in (repositories.values() if isinstance(repositories, dict) else [repositories]):
                if repository._repo_id.startswith("kernels-community/"):
                    version, kinds = repos.setdefault(repository._repo_id, (repository._version, set()))
                    kinds.add(kind)
    return repos


def test_hwenvs_table_is_transformers_default_kernel_mapping():
    mapping = _transformers_mapping()
    assert {repo: (version, set(kinds)) for repo, (version, kinds) in DEFAULT_KERNEL_REPOS.items()} == mapping
    from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

    every = {getattr(d, "type", d) for devices in get_kernel_mapping_transformers().values() for d in devices}
    assert every == set(HUB_KERNEL_DEVICE_TYPES)  # no cpu, mps or hpu entry


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hwrun.testing import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-hub-kernels")))


def test_a_plain_from_pretrained_kernelizes_unless_use_hub_kernels_is_off(tiny, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    assert AutoModelForCausalLM.from_pretrained(tiny).use_kernels is True  # absent use_kernels means True
    assert hwenv.hub_kernels_status("cpu", {}).default_on is True  # read from the same installed source
    monkeypatch.setenv("USE_HUB_KERNELS", "NO")
    assert AutoModelForCausalLM.from_pretrained(tiny).use_kernels is False
    assert hwenv.hub_kernels_status("cuda", {"USE_HUB_KERNELS": "NO"}).reaches_hub is False
    monkeypatch.setenv("USE_HUB_KERNELS", "yes")
    assert AutoModelForCausalLM.from_pretrained(tiny, use_kernels=False).use_kernels is False  # what hwattn passes


def test_offline_a_missing_version_raises_what_the_gpu_runs_died_of(tmp_path, monkeypatch):
    import huggingface_hub.constants
    from transformers.integrations.hub_kernels import get_kernel

    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"Version 2 of 'kernels-community/rotary' is not available in the local cache"):
        get_kernel("kernels-community/rotary", version=2)
    env = {"HF_HUB_OFFLINE": "1", "KERNELS_CACHE": str(tmp_path)}
    for device in ("cuda", "xpu", "rocm"):
        status = hwenv.hub_kernels_status(device, env)
        assert status.reaches_hub and status.fails_offline and "not available in the local cache" in status.reason()
    assert not hwenv.hub_kernels_status("hpu", env).reaches_hub and not hwenv.hub_kernels_status("cpu", env).fails_offline


def test_with_the_versions_cached_offline_is_fine(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "KERNELS_CACHE": str(tmp_path)}
    for repo, (version, _) in DEFAULT_KERNEL_REPOS.items():
        refs = cache_dir(env) / ("kernels--" + repo.replace("/", "--")) / "refs"
        refs.mkdir(parents=True)
        (refs / f"v{version}").write_text("0" * 40)
    status = hwenv.hub_kernels_status("xpu", env)
    assert status.reaches_hub and not status.fails_offline and status.missing == ()


def test_doctor_says_it_with_the_fix(fake_xpu, tmp_path, monkeypatch):
    from hwenv import diagnose

    fake_xpu(1)
    for name in ("TRANSFORMERS_OFFLINE", "USE_HUB_KERNELS"):  # CI sets TRANSFORMERS_OFFLINE=1 too
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found = next(p for p in diagnose().problems if p.code == "hub-kernels-offline")
    assert "kernels-community/rotary v2" in found.message and "hwrun is not affected" in found.message
    assert found.fix.startswith("set USE_HUB_KERNELS=NO") and "once with the Hub reachable" in found.fix
    monkeypatch.delenv("HF_HUB_OFFLINE")
    note = next(n for n in diagnose().notes if n.startswith("Hub kernels: "))
    assert "an offline run would fail" in note and "USE_HUB_KERNELS=NO" in note  # online: a note with the fix
    monkeypatch.setenv("USE_HUB_KERNELS", "NO")
    report = diagnose()
    assert "hub-kernels-offline" not in {p.code for p in report.problems}
    assert any(n.startswith("Hub kernels: USE_HUB_KERNELS='NO' turns Hub kernels off") for n in report.notes)
