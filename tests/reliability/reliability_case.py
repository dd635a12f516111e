"""One bad-input case of the reliability suite: what to run, what it did before issue 27, what it does now.

A table is a `cases_<package>.py` module beside this one holding `CASES: tuple[Case, ...]`;
`test_cli_cases.py` runs every table's cases through the real CLI and `tools/reliability_doc.py`
writes docs/reliability.md from the same tables. Adding a CLI (hwrun) is adding one table file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The issue's classes of failure, in the order docs/reliability.md lists them.
CLASSES = {
    "data-lost": "Data lost",
    "hang-unbounded": "Hang or unbounded",
    "traceback-from-cli": "Python traceback from a CLI",
    "silently-accepted": "Silently accepted",
    "unclear-error": "Unclear or misleading error",
}
#: What the suite asserts per expectation.
EXPECTATIONS = {
    "exit-2": "exit 2, exactly one line on stderr naming the value, no traceback, no file changed",
    "doctor-problem": "`hwenv doctor --json` reports the problem code with the value named, no file changed",
}


@dataclass(frozen=True)
class Case:
    """A bad input: `argv` for `python -m <module>` with `env` added, run in a scratch folder.

    `named` must appear in the one stderr line (or the doctor problem); `klass` is a key of
    `CLASSES`; `before` says what happened before issue 27 and `outcome` what happens now.
    """

    id: str
    module: str  # "hwenv.cli", "hwdist", later "hwrun.cli.main"
    argv: tuple[str, ...]
    klass: str
    before: str
    outcome: str
    named: str
    env: dict[str, str] = field(default_factory=dict)
    expect: str = "exit-2"
    problem: str = ""  # the doctor problem code, for expect="doctor-problem"
    files: dict[str, str | bytes] = field(default_factory=dict)  # extra files in the scratch folder (a bad input file)
    slow: bool = False  # the process imports the training stack or trains: a longer bound, pytest's slow marker

    def command(self) -> str:
        """The command as a user types it (env first), for the generated document."""
        program = {"hwenv.cli": "hwenv", "hwdist": "hwdist"}.get(self.module, self.module.split(".")[0])
        import shlex

        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in self.env.items())
        return " ".join(part for part in (env, program, *(shlex.quote(arg) for arg in self.argv)) if part)
