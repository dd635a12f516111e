"""Rebuild the committed training text in tools/data/ from its offline sources.

This script is only needed to *re-create* the ``*.txt`` files next to it; the
training script (``tools/train_tiny_model.py``) reads the committed files and
never runs this.  See ``README.md`` in this folder for what each source is and
why it is public domain.

Sources (both reachable from a machine whose only network is package
registries):

* The Canterbury-corpus files ``alice29.txt`` and ``asyoulik.txt`` that the
  Brotli project ships as test data in its PyPI source distribution::

      pip download --no-deps --no-binary :all: -d /tmp/brotli-src brotli==1.2.1
      tar xzf /tmp/brotli-src/brotli-1.2.1.tar.gz -C /tmp/brotli-src

* The King James Version text of Debian's ``bible-kjv-text`` package, read
  through the ``bible`` program of Debian's ``bible-kjv`` package::

      apt-get install -y bible-kjv      # pulls in bible-kjv-text (4.38)

Usage::

    python tools/data/prepare_data.py --brotli-testdata /tmp/brotli-src/brotli-1.2.1/tests/testdata
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (output file, title, verse range understood by Debian's `bible -f`)
KJV_BOOKS = [
    ("kjv_genesis.txt", "THE FIRST BOOK OF MOSES, CALLED GENESIS", "Gen1:1-Gen50:26"),
    ("kjv_exodus.txt", "THE SECOND BOOK OF MOSES, CALLED EXODUS", "Exodus1:1-Exodus40:38"),
    ("kjv_joshua.txt", "THE BOOK OF JOSHUA", "Joshua1:1-Joshua24:33"),
    ("kjv_judges.txt", "THE BOOK OF JUDGES", "Judges1:1-Judges21:25"),
    ("kjv_ruth.txt", "THE BOOK OF RUTH", "Ruth1:1-Ruth4:22"),
    ("kjv_1samuel.txt", "THE FIRST BOOK OF SAMUEL", "1Sam1:1-1Sam31:13"),
    ("kjv_2samuel.txt", "THE SECOND BOOK OF SAMUEL", "2Sam1:1-2Sam24:25"),
    ("kjv_1kings.txt", "THE FIRST BOOK OF THE KINGS", "1Kings1:1-1Kings22:53"),
    ("kjv_2kings.txt", "THE SECOND BOOK OF THE KINGS", "2Kings1:1-2Kings25:30"),
    ("kjv_esther.txt", "THE BOOK OF ESTHER", "Esther1:1-Esther10:3"),
    ("kjv_daniel.txt", "THE BOOK OF DANIEL", "Daniel1:1-Daniel12:13"),
    ("kjv_jonah.txt", "THE BOOK OF JONAH", "Jonah1:1-Jonah4:11"),
]


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def prepare_alice(src: Path) -> str:
    """Alice's Adventures in Wonderland: reflow hard-wrapped paragraphs."""
    raw = src.read_text(encoding="ascii").replace("\r\n", "\n")
    raw = raw.replace("`", "'")  # the etext opens quotes with a backtick
    paras = [_squash(p) for p in re.split(r"\n\s*\n", raw)]
    return "\n\n".join(p for p in paras if p) + "\n"


def prepare_as_you_like_it(src: Path) -> str:
    """As You Like It: one speech per paragraph, as ``SPEAKER: words``."""
    raw = src.read_text(encoding="ascii").replace("\r\n", "\n")
    out = []
    for block in re.split(r"\n\s*\n", raw):
        lines = [ln for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        first = lines[0]
        if "\t" in first and not first.startswith("\t"):
            speaker, _, rest = first.partition("\t")
            words = _squash(" ".join([rest] + lines[1:]))
            out.append(f"{speaker.strip()}: {words}" if words else speaker.strip())
        else:
            out.append(_squash(" ".join(lines)))
    return "\n\n".join(p for p in out if p) + "\n"


def prepare_kjv(title: str, spec: str) -> str:
    """One verse per line (reference stripped), a blank line between chapters."""
    res = subprocess.run(["bible", "-f", spec], check=True, capture_output=True, text=True)
    out = [title, ""]
    chapter = None
    for line in res.stdout.splitlines():
        m = re.match(r"^(\S+?)(\d+):(\d+) (.*)$", line)
        if not m:
            continue
        if chapter is not None and m.group(2) != chapter:
            out.append("")
        chapter = m.group(2)
        out.append(_squash(m.group(4)))
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brotli-testdata", type=Path, required=True)
    args = ap.parse_args()
    (HERE / "alice_in_wonderland.txt").write_text(
        prepare_alice(args.brotli_testdata / "alice29.txt")
    )
    (HERE / "as_you_like_it.txt").write_text(
        prepare_as_you_like_it(args.brotli_testdata / "asyoulik.txt")
    )
    for name, title, spec in KJV_BOOKS:
        (HERE / name).write_text(prepare_kjv(title, spec))
    for p in sorted(HERE.glob("*.txt")):
        print(f"{p.name:28s} {p.stat().st_size:>8d} bytes")


if __name__ == "__main__":
    main()
