"""Suite-wide set-up for `uv run pytest` (issue 40: the README's test command fast on 2 cores, on any machine).

- Bytecode: where the environment says PYTHONDONTWRITEBYTECODE and the venv holds no `.pyc` (`uv sync` without
  UV_COMPILE_BYTECODE, as on this machine), every Python process of the suite (a worker, each CLI subprocess)
  compiled torch's and Transformers' sources again: importing hwrun's CLI, Transformers' model code and PEFT took
  39 s instead of 15 s here (2 cores, load 4). The suite then keeps the bytecode under `.pytest_cache/d/pycache`
  (PYTHONPYCACHEPREFIX, inherited by every subprocess), never beside a source file, as the variable asks.
  Since the workspace sets uv's `compile-bytecode = true`, `uv run` compiles the venv and this stays inert; it
  still serves a venv made otherwise (`uv sync` of an older checkout, `pip install`).
- pytest-xdist runs with `--dist loadscope` (pyproject's addopts): a module's tests stay on one worker, so a
  module-scoped fixture (a trained run, a launched 2-process job) is built once. (`loadgroup` with xdist_group
  marks per fixture does nothing with pytest 9.2 and xdist 3.8: xdist sets `item._nodeid`, which pytest 9.2 no
  longer reads, so each worker built such a fixture again: the ZeRO runs twice, 143 s and 156 s.)
- The garbage collector (issue 40.2): a worker holds ~560,000 objects once torch, Transformers, PEFT and the test
  modules are imported, and every full collection walks them all: 0.25-0.7 s each on 2 cores, and the libraries
  under test collect on purpose (accelerate's `release_memory` after each Trainer run, Transformers' continuous
  batching, `hwdist.shutdown()`), besides Python's own full collections. After collection each worker collects once
  and freezes what is left (`gc.freeze()`: those objects move to a generation the collector skips) and unfreezes at
  the end. Objects made by tests are collected as before; what was imported lives for the session anyway (an
  object from before the freeze that a test turns into cyclic garbage stays until the end: memory only). Measured
  on HEAD's tests with `-n 0` (2026-12-06): test_hwrun_families + decode_sampling + train_nonfinite + train_owner +
  hwdist_hot_path + hwattn_declared 73.0 -> 44.1 CPU-s (their test time 60.9 -> 31.4 s); test_hwrun_train_run +
  inf_generate + hwdist_context + inf_decoder_lifetime 31.1 -> 24.0 CPU-s.
- torch's threads in the workers (issue 40.2): torch gives each process one intra-op thread per core, so two workers
  on 2 cores ran 4 OpenMP threads on 2 cores, whose waits spin (the README's decode figure, 16.8 against 264.5 tok/s,
  is the same effect). Each xdist worker sets `torch.set_num_threads(cores // workers)` (at least 1) at start, unless
  OMP_NUM_THREADS is set; the environment is left as it is, so hwrun's thread rule and the processes a test starts
  see what a user's would. HEAD's decode_sampling + inf_generate + train_run + decode_families + train_nonfinite
  with `-n 2`: 89.2 -> 50.4 CPU-s, 51.7 -> 41.6 s (2026-12-06).
- The scheduling of those modules (`CostFirstScheduling`, issue 40.2): xdist's loadscope hands modules out in
  order of their test count, so a module of two 2-minute tests could start last and leave one worker running it
  alone for minutes while the other had finished. Here the costliest module goes first (longest-processing-time
  first), the cost being the seconds its tests took when they last ran in this checkout (`.pytest_cache`), or,
  on a fresh clone, `EXPECTED_S` below (measured), else a guess from its test count; and the modules in `ONE_BY_ONE`
  (many independent end-to-end tests, no module-scoped set-up) are handed out one test at a time, so that they
  fill the gaps at the end instead of being one long block.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest


def _venv_has_bytecode() -> bool:
    """True when the installed torch (the largest import of the suite) was compiled at install."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return True  # nothing to gain
    return Path(importlib.util.cache_from_source(spec.origin)).is_file()


def _keep_bytecode(config: pytest.Config) -> None:
    """Point this process and its subprocesses at one bytecode folder outside the sources (see the module doc)."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX") or _venv_has_bytecode():
        return
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    folder = cache.mkdir("pycache") if cache is not None else Path(tempfile.gettempdir()) / f"hwstack-pycache-{os.getuid()}"
    os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)
    sys.pycache_prefix = str(folder)
    sys.dont_write_bytecode = False


#: Device-selection and mode variables that code under test may set in os.environ (hwrun's plan applies its env;
#: the Gaudi fake reads PT_HPU_LAZY_MODE): each test gets them back as they were, so none leaks into the next test
#: of the same xdist worker (a PT_HPU_LAZY_MODE=1 left behind failed an unrelated hwcompile test on 2026-12-06).
_DEVICE_VARIABLES = ("PT_HPU_LAZY_MODE", "PT_ENABLE_INT64_SUPPORT", "HABANA_VISIBLE_MODULES", "HLS_MODULE_ID",
                     "ZE_AFFINITY_MASK", "ZE_ENABLE_PCI_ID_DEVICE_ORDER", "ZE_FLAT_DEVICE_HIERARCHY", "HWENV_DEVICE")


@pytest.fixture(autouse=True)
def _restore_device_variables():
    import os

    saved = {name: os.environ.get(name) for name in _DEVICE_VARIABLES}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# Scheduling of the xdist workers (issue 40.2; the module doc says why). -----------------------------------------

#: Modules whose tests are handed out one at a time: each test is an end-to-end run of its own (a subprocess, a
#: server, torchrun's ranks) and none shares a module-scoped set-up, so spreading them over the workers builds
#: nothing twice.
ONE_BY_ONE = frozenset({
    "tests/reliability/test_cli_cases.py",
})

#: Seconds each of the costliest modules took (all its tests: set-up, call and teardown) in a full `uv run pytest`
#: (2026-12-06 13:39-14:42 UTC, this 2-core machine at load 4-20, mostly 10-16, beside other work: ~5x a quiet
#: run's time; their ratios are what matters). They set the order on a fresh clone, where `.pytest_cache` holds no
#: run yet. A module missing here is guessed from its test count (`_GUESS_PER_TEST_S`); a wrong figure only changes
#: the order, never what runs.
EXPECTED_S: dict[str, float] = {
    "packages/hwrun/tests/test_hwrun_decode_slots_buckets.py": 1018,
    "packages/hwrun/tests/test_hwrun_families.py": 547,
    "packages/hwrun/tests/test_hwrun_train_fsdp.py": 315,  # 426 then; 4 launches -> 2 since (105 -> 78 CPU-s quiet)
    "tests/reliability/test_cli_cases.py": 70,  # 340 then; most cases run in process since (163 -> 33 CPU-s quiet)
    "packages/hwrun/tests/test_hwrun_train_run.py": 338,
    "packages/hwrun/tests/test_hwrun_decode_slots_families.py": 312,
    "packages/hwrun/tests/test_hwrun_decode_slots_steps.py": 288,
    "packages/hwrun/tests/test_hwrun_inf_generate.py": 286,
    "packages/hwrun/tests/test_hwrun_decode_sampling.py": 204,
    "packages/hwrun/tests/test_hwrun_train_deepspeed.py": 118,  # 158 then; 3 launches -> 2 since (94 -> 71 CPU-s)
    "packages/hwrun/tests/test_hwrun_tp_generate.py": 151,
    "packages/hwrun/tests/test_hwrun_engine_sampling_knobs.py": 132,
    "packages/hwattn/tests/test_hwattn_declared.py": 132,
    "packages/hwrun/tests/test_hwrun_train_output.py": 130,
    "packages/hwrun/tests/test_hwrun_train_nonfinite.py": 130,
    "packages/hwrun/tests/test_hwrun_engine_chunked_prefill.py": 120,
    "packages/hwrun/tests/test_hwrun_serve_soak.py": 119,
    "packages/hwrun/tests/test_hwrun_tp_serve.py": 118,
    "packages/hwenv/tests/test_hwenv_gaudi_fake_drift.py": 118,
    "packages/hwrun/tests/test_hwrun_serve_openai_server.py": 117,
    "packages/hwrun/tests/test_hwrun_train_owner.py": 116,
    "packages/hwrun/tests/test_hwrun_train_faults.py": 114,
    "packages/hwenv/tests/test_hwenv_platforms.py": 114,
    "packages/hwrun/tests/test_hwrun_decode_families.py": 112,
    "packages/hwrun/tests/test_hwrun_train_fsdp_cli.py": 150,  # + the --fsdp-checkpoint full runs in its launches
    "packages/hwrun/tests/test_hwrun_serve.py": 107,
    "packages/hwrun/tests/test_hwrun_engine_sampling_choices.py": 95,
    "packages/hwrun/tests/test_hwrun_decode_graph_fakes.py": 91,
    "packages/hwrun/tests/test_hwrun_inf_fastdecode.py": 86,
    "packages/hwcompile/tests/test_hwcompile_cache.py": 86,
    "packages/hwrun/tests/test_hwrun_train_callbacks.py": 81,
    "packages/hwrun/tests/test_hwrun_train_progress.py": 75,
    "packages/hwrun/tests/test_hwrun_train_resume_match.py": 68,
    "packages/hwrun/tests/test_hwrun_train_kernels.py": 54,
    "packages/hwrun/tests/test_hwrun_train_chat_data.py": 51,
    "tests/test_compose_stack.py": 51,
    "packages/hwrun/tests/test_hwrun_train_kernel_policy.py": 47,
    "packages/hwrun/tests/test_hwrun_train_cli.py": 44,
    "packages/hwrun/tests/test_hwrun_serve_soak_faults.py": 41,
    "packages/hwrun/tests/test_hwrun_quant_torchao_cpu.py": 41,
    "packages/hwdist/tests/test_hwdist_hot_path.py": 41,
    "packages/hwrun/tests/test_hwrun_train_readme.py": 300,  # 153 s on a quiet machine; not in that run's figures
}

_GUESS_PER_TEST_S = 0.5
_SECONDS_KEY = "hwstack/test-seconds"


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _scope_of(nodeid: str) -> str:
    """A module's tests stay together (they may share its module-scoped fixtures), except in `ONE_BY_ONE`."""
    module = _module_of(nodeid)
    return nodeid if module in ONE_BY_ONE else module


def _make_cost_first_scheduling(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class CostFirstScheduling(LoadScopeScheduling):
        """xdist's loadscope, but the costliest pending unit (a module, or one test of `ONE_BY_ONE`) goes first."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            cache = getattr(config, "cache", None)
            self.seconds: dict[str, float] = dict(cache.get(_SECONDS_KEY, {})) if cache is not None else {}
            self.module_sizes: dict[str, int] | None = None

        def _split_scope(self, nodeid: str) -> str:
            return _scope_of(nodeid)

        def cost(self, scope: str, tests) -> float:
            known = [self.seconds[t] for t in tests if t in self.seconds]
            if len(known) == len(tests):  # every test ran in this checkout before (a run with -k ran only some)
                return sum(known)
            module = _module_of(scope)
            if module in EXPECTED_S:
                if self.module_sizes is None:
                    self.module_sizes = {}
                    for nodeid in self.collection or ():
                        self.module_sizes[_module_of(nodeid)] = self.module_sizes.get(_module_of(nodeid), 0) + 1
                return EXPECTED_S[module] * len(tests) / max(1, self.module_sizes.get(module, len(tests)))
            return sum(known) + _GUESS_PER_TEST_S * (len(tests) - len(known))

        def _assign_work_unit(self, node) -> None:
            costliest = max(self.workqueue, key=lambda scope: self.cost(scope, self.workqueue[scope]))
            self.workqueue.move_to_end(costliest, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            # xdist tops a worker up while it has 2 tests pending; 1 is enough (a worker runs a test once it knows
            # the next one or is told to stop), and fewer units queued ahead means no worker is left, at the end,
            # with a queue of work that the idle one could have taken.
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

    return CostFirstScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadscope":
        return None  # `--dist load` etc. on the command line: xdist's own
    return _make_cost_first_scheduling(config, log)


class _TestSeconds:
    """In the xdist controller (or a run without workers): each test's seconds, written to `.pytest_cache`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(session.config, "cache", None)
        if cache is None or not self.seconds:
            return
        seconds = dict(cache.get(_SECONDS_KEY, {}))
        seconds.update({nodeid: round(value, 3) for nodeid, value in self.seconds.items()})
        cache.set(_SECONDS_KEY, seconds)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what the imports and the collection made (the module doc says why): collected first, so that no
    garbage is frozen with it."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    gc.unfreeze()  # the interpreter's own last collection then sees everything again, as without the freeze


def _share_the_cores(config: pytest.Config) -> None:
    """In an xdist worker: torch's intra-op threads are the host's cores shared by the workers (the module doc)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or os.environ.get("OMP_NUM_THREADS"):
        return
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(max(1, cores // int(workerinput.get("workercount", 1))))


def pytest_configure(config: pytest.Config) -> None:
    _keep_bytecode(config)
    _share_the_cores(config)
    if not hasattr(config, "workerinput"):  # not in an xdist worker: the controller sees every worker's reports
        config.pluginmanager.register(_TestSeconds(), "hwstack-test-seconds")
