"""The decision tables in README.md, generated from `resolve_attention` so the docs cannot drift.

`python -m hwattn` prints them; a test checks README.md contains exactly this output.
"""

from __future__ import annotations

from hwenv import Accelerator

from .capabilities import FLASH, GQA, HUB_KERNELS, FlashSupport
from .environment import AttentionEnvironment
from .errors import HwattnError
from .names import FLASH_DISTRIBUTION, check_name
from .resolve import AttentionChoice, _resolve

#: The devices the tables show (rows).
TABLE_DEVICES: tuple[tuple[str, Accelerator], ...] = (
    ("XPU, torch 2.8", Accelerator("xpu", torch_version="2.8.0")),
    ("XPU, torch 2.7", Accelerator("xpu", torch_version="2.7.1")),
    ("CUDA sm 9.0 (H100/H200)", Accelerator("cuda", capability=(9, 0), torch_version="2.8.0")),
    ("CUDA sm 8.0 (A100)", Accelerator("cuda", capability=(8, 0), torch_version="2.8.0")),
    ("CUDA sm 7.5 (T4)", Accelerator("cuda", capability=(7, 5), torch_version="2.8.0")),
    ("ROCm gfx942 (MI300X)", Accelerator("rocm", capability=(9, 4), torch_version="2.8.0")),
    ("Gaudi (hpu)", Accelerator("hpu", torch_version="2.8.0")),
    ("MPS, torch 2.8", Accelerator("mps", torch_version="2.8.0")),
    ("CPU", Accelerator("cpu", torch_version="2.8.0")),
)
#: The requested names the tables show (columns).
TABLE_REQUESTS: tuple[str, ...] = (
    "auto", "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4",
    "kernels-community/flash-attn2",
)
#: The software the main table assumes: `kernels` usable, no flash-attn packages.
TABLE_ENVIRONMENT = AttentionEnvironment(kernels_available=True, flash_packages=frozenset())

_GQA = {True: "GQA native", False: "KV repeated", None: "GQA per call"}


def _try(accel: Accelerator, requested: str, env: AttentionEnvironment, fallback: bool) -> AttentionChoice | str:
    try:
        return _resolve(accel, check_name(requested), None, fallback, env, log=False)
    except HwattnError as error:
        return type(error).__name__


def _cell(accel: Accelerator, requested: str, env: AttentionEnvironment) -> str:
    strict = _try(accel, requested, env, fallback=False)
    if isinstance(strict, AttentionChoice):
        return f"`{strict.implementation}` ({_GQA[strict.gqa_native]})"
    loose = _try(accel, requested, env, fallback=True)
    if isinstance(loose, AttentionChoice):
        return f"error `{strict}`; fallback=True: `{loose.implementation}`"
    return f"error `{strict}`"


def decision_table(environment: AttentionEnvironment = TABLE_ENVIRONMENT) -> str:
    """Markdown table: device (rows) x requested (columns) -> `attn_implementation` or the error raised."""
    header = "| device | " + " | ".join(f"`{r}`" for r in TABLE_REQUESTS) + " |"
    rule = "|---" * (len(TABLE_REQUESTS) + 1) + "|"
    rows = [f"| {label} | " + " | ".join(_cell(accel, r, environment) for r in TABLE_REQUESTS) + " |"
            for label, accel in TABLE_DEVICES]
    return "\n".join([header, rule, *rows])


#: (label, environment) pairs for the software table.
SOFTWARE_CASES: tuple[tuple[str, AttentionEnvironment], ...] = (
    ("kernels usable, no flash-attn", AttentionEnvironment(kernels_available=True)),
    ("no kernels, no flash-attn", AttentionEnvironment(kernels_available=False)),
    ("kernels usable, flash-attn + flash-attn-3 installed",
     AttentionEnvironment(kernels_available=True, flash_packages=frozenset({"flash_attention_2", "flash_attention_3"}))),
    ("no kernels, flash-attn installed",
     AttentionEnvironment(kernels_available=False, flash_packages=frozenset({"flash_attention_2"}))),
)


def _device(label: str) -> Accelerator:
    return next(accel for name, accel in TABLE_DEVICES if name == label)


def software_table() -> str:
    """Markdown table: how installed software changes flash requests on XPU, CUDA sm 9.0 and ROCm."""
    xpu, cuda, rocm = _device("XPU, torch 2.8"), _device("CUDA sm 9.0 (H100/H200)"), _device("ROCm gfx942 (MI300X)")
    columns = (("XPU", xpu, "flash_attention_2"), ("CUDA sm 9.0", cuda, "flash_attention_2"),
               ("CUDA sm 9.0", cuda, "flash_attention_3"), ("ROCm", rocm, "flash_attention_2"))
    header = "| software | " + " | ".join(f"{d}: `{r}`" for d, _, r in columns) + " |"
    rule = "|---" * (len(columns) + 1) + "|"
    rows = [f"| {label} | " + " | ".join(_cell(a, r, env) for _, a, r in columns) + " |" for label, env in SOFTWARE_CASES]
    return "\n".join([header, rule, *rows])


def _flash_cell(support: FlashSupport) -> str:
    if not support.kernels:
        return f"none: {support.why_not}; flash requests raise, `fallback=True` gives `sdpa`"
    ways = [f"`{name}`: " + (f"{FLASH_DISTRIBUTION[name]} package, else " if support.packages else "")
            + f"`{repo}`" for name, repo in support.kernels.items()]
    return "; ".join(ways) + f". {support.reason}"


def capability_table() -> str:
    """Markdown table: hwattn's per-kind rows (`hwattn.capabilities`) for every registered platform."""
    from hwenv import platforms

    header = ("| kind | FlashAttention (`capabilities.FLASH`) | hub kernels: kernels device / KernelConfig key "
              "(`HUB_KERNELS`) | SDPA GQA with a mask (`GQA`) |")
    rows = [header, "|---|---|---|---|"]
    for platform in platforms():
        flash, hub, gqa = FLASH.get(platform.kind), HUB_KERNELS.get(platform.kind), GQA.get(platform.kind)
        if flash is None or hub is None or gqa is None:
            rows.append(f"| `{platform.kind}` ({platform.display_name}) | no row | no row | no row |")
            continue
        names = (f"`{hub.kernels_device}` / " + (f"`{hub.config_key}`" if hub.config_key else "none") + ": "
                 if hub.kernels_device else "")
        masked = (f"native from torch {gqa.masked_from[0]}.{gqa.masked_from[1]}" if gqa.masked_from
                  else "KV repeated (native only without a mask, head dims <= 256)")
        rows.append(f"| `{platform.kind}` ({platform.display_name}) | {_flash_cell(flash)} | "
                    f"{names}{hub.reason} | {masked}: {gqa.reason} |")
    return "\n".join(rows)


def readme_blocks() -> dict[str, str]:
    """{marker name: generated markdown} for the README blocks `<!-- name:start -->` ... `<!-- name:end -->`."""
    return {"decision-table": decision_table(), "software-table": software_table(),
            "capability-table": capability_table()}


def update_readme(text: str) -> str:
    """`text` with every generated block replaced by the current tables."""
    for name, table in readme_blocks().items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        head, _, rest = text.partition(start)
        _, found, tail = rest.partition(end)
        if not found:
            raise ValueError(f"README has no {start} ... {end} block")
        text = f"{head}{start}\n{table}\n{end}{tail}"
    return text


def main(argv: list[str] | None = None) -> int:
    """`python -m hwattn` prints the tables; `--update README.md` rewrites its generated blocks."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m hwattn", description=main.__doc__)
    parser.add_argument("--update", metavar="README", help="rewrite the generated blocks of this file")
    args = parser.parse_args(argv)
    if args.update:
        path = Path(args.update)
        path.write_text(update_readme(path.read_text()))
    else:
        print(decision_table(), software_table(), capability_table(), sep="\n\n")
    return 0
