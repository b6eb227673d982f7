"""Every script in `scripts/` explains itself to a SGLang user.

Python scripts: `--help` (and each sub-command's `--help`) exits 0 within seconds, its description is in plain words
(no internal work-item references) and not cut off mid-sentence, every option has help text, and every environment
variable the script reads is named in it. Shell scripts: `--help` prints the header, which names every variable the
script reads; a script missing a required variable or argument stops at once with one line saying which (checked on
copies run in a scratch folder whose `scripts/gpu_env.sh` is a stub, so a regression cannot start GPU work).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
VENV_PY = ROOT / ".venv" / "bin" / "python"
PY = str(VENV_PY if VENV_PY.exists() else sys.executable)
PY_SCRIPTS = sorted(p.name for p in SCRIPTS.glob("*.py"))
SH_SCRIPTS = sorted(p.name for p in SCRIPTS.glob("*.sh"))
INTERNAL = re.compile(r"\bissues? #?\d+|\bitems? \d|\bthe foundation issue\b", re.IGNORECASE)
SECTION_STARTS = {"options:", "optional arguments:", "positional arguments:"}
HELP_TIMEOUT_S = 60
#: shell scripts -> the variable that must be set (checked with it unset)
SH_REQUIRED_VAR = {"gpu_zerodp_microbench.sh": "OUT"}
#: shell scripts that need positional arguments (checked with none)
SH_REQUIRED_ARGS = ("gpu_calibrate_model.sh", "gpu_capacity_probe.sh", "gpu_compare_families.sh", "gpu_runs.sh")
#: variables a shell script may read without documenting them
SH_STANDARD_VARS = {"PATH", "PWD", "HOME", "BASH_SOURCE"}


def run_help(script: str, *sub: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, str(SCRIPTS / script), *sub, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=HELP_TIMEOUT_S)


def entry(line: str) -> tuple[str, str]:
    """One entry line, "  --flag VALUE   help" or "  --flag VALUE", as (invocation, help)."""
    parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
    return parts[0], (parts[1] if len(parts) > 1 else "")


def parse_help(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(description as one line, [(option, its help as one line)]) of an argparse help text."""
    lines = text.splitlines()
    rest = lines[lines.index("") + 1:]  # after the usage block
    start = next(i for i, line in enumerate(rest) if line in SECTION_STARTS)
    description = " ".join(line.strip() for line in rest[:start] if line.strip())
    options: list[tuple[str, str]] = []
    i = start
    # a section: a title ("options:", an argument group's "servers:") right above indented entries; the epilog, if
    # any, starts at the first other line
    while i + 1 < len(rest) and re.match(r"^\S.*:$", rest[i]) and rest[i + 1].startswith("  "):
        i += 1
        while i < len(rest) and rest[i].startswith("  "):
            line = rest[i]
            if line.startswith("   "):  # the help of the entry above, continued
                name, help_text = options[-1]
                options[-1] = (name, f"{help_text} {line.strip()}".strip())
            else:  # "  --flag VALUE   help" or "  --flag VALUE" with the help on the next lines
                options.append(entry(line))
            i += 1
        while i < len(rest) and not rest[i]:
            i += 1
    return description, options


def environment_reads(source: str) -> set[str]:
    """Names of the environment variables a Python source reads."""
    pattern = r"""(?:os\.environ(?:\.get|\.setdefault|\.pop)?\s*[\[(]|os\.getenv\s*\()\s*["']([A-Za-z_][A-Za-z0-9_]*)"""
    return set(re.findall(pattern, source))


@pytest.mark.parametrize("script", PY_SCRIPTS)
def test_python_script_help(script):
    res = run_help(script)
    assert res.returncode == 0, f"{script} --help failed:\n{res.stderr[-2000:]}"
    check_help_text(script, res.stdout)
    source = (SCRIPTS / script).read_text()
    for name in environment_reads(source):
        assert name in res.stdout, f"{script} reads ${name} but its --help does not say so"
    # sub-commands ("{measure,report}" in the positional arguments) answer --help the same way
    for found in re.findall(r"^  \{([\w,-]+)\}\s*$", res.stdout, re.MULTILINE):
        for sub in found.split(","):
            sub_res = run_help(script, sub)
            assert sub_res.returncode == 0, f"{script} {sub} --help failed:\n{sub_res.stderr[-2000:]}"
            _, options = parse_help(sub_res.stdout)
            assert options, sub_res.stdout
            assert not [o for o, h in options if not h], f"{script} {sub}: options without help text"


def check_help_text(script: str, text: str) -> None:
    description, options = parse_help(text)
    assert description, f"{script}: --help has no description"
    assert not INTERNAL.search(description), f"{script}: the description cites an internal work item: {description}"
    # a whole sentence (or ending on the command it tells the user to run), not cut off at a line break
    assert description[-1] in ".!?:)`\"'" or re.search(r"\bpip install \S+$", description), (
        f"{script}: the description ends mid-sentence: ...{description[-80:]!r}")
    assert options, f"{script}: no options found in --help"
    missing = [name for name, help_text in options if not help_text]
    assert not missing, f"{script}: options without help text: {missing}"


@pytest.mark.parametrize("script", PY_SCRIPTS)
def test_python_script_docstring_has_no_internal_references(script):
    import ast

    doc = ast.get_docstring(ast.parse((SCRIPTS / script).read_text())) or ""
    assert doc, f"{script} has no module docstring"
    assert not INTERNAL.search(doc), f"{script}: the docstring cites an internal work item: {INTERNAL.search(doc)[0]}"


def test_parse_help_reads_options_and_epilog_apart():
    text = ("usage: x.py [-h] [--a A]\n\nDoes x.\n\noptions:\n  -h, --help  show this help message and exit\n"
            "  --a A       the a\n  --long-option-name LONG_OPTION_NAME\n                        wrapped help\n"
            "  --bare BARE\n\ngroup:\n  --b B\n\nAn epilog paragraph:\n\n  vanilla: not an option\n")
    description, options = parse_help(text)
    assert description == "Does x."
    assert options == [("-h, --help", "show this help message and exit"), ("--a A", "the a"),
                       ("--long-option-name LONG_OPTION_NAME", "wrapped help"), ("--bare BARE", ""), ("--b B", "")]


# --- shell scripts ----------------------------------------------------------------------------------------------


def header(script: str) -> str:
    lines = []
    for line in (SCRIPTS / script).read_text().splitlines():
        if line.startswith("#!"):
            continue
        if not line.startswith("#"):
            break
        lines.append(re.sub(r"^# ?", "", line))
    return "\n".join(lines)


def shell_variable_reads(source: str) -> set[str]:
    """Upper-case variables a shell script reads that it does not set itself (`X=${X:-...}` counts as a read)."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
    read = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", code))
    assigned = set(re.findall(r"(?:^|[\s;(])([A-Z_][A-Z0-9_]*)=", code))
    self_referencing = {v for v in assigned if re.search(rf"\b{v}=[^\s;]*\$\{{?{v}\b", code)}
    return (read - assigned - SH_STANDARD_VARS) | (self_referencing - SH_STANDARD_VARS)


@pytest.fixture
def sandbox(tmp_path):
    """A scratch repo root holding copies of the shell scripts; its `scripts/gpu_env.sh` stops anything that sources
    it (exit 97), and the real gpu_env.sh is copied as `gpu_env_real.sh` with /tmp/site pointed into the sandbox."""
    d = tmp_path / "scripts"
    d.mkdir()
    for script in SH_SCRIPTS:
        shutil.copy(SCRIPTS / script, d / script)
    real = [line if line.startswith("#") else line.replace("/tmp/site", str(tmp_path / "site"))
            for line in (SCRIPTS / "gpu_env.sh").read_text().splitlines()]
    (d / "gpu_env_real.sh").write_text("\n".join(real) + "\n")
    (d / "gpu_env.sh").write_text('echo "gpu_env.sh was sourced" >&2; exit 97\n')
    return tmp_path


def run_sh(sandbox: Path, script: str, *args: str, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run(["bash", f"scripts/{script}", *args], cwd=sandbox, env=env, capture_output=True, text=True,
                          timeout=HELP_TIMEOUT_S)


@pytest.mark.parametrize("script", SH_SCRIPTS)
def test_shell_script_help_prints_the_header(script, sandbox):
    name = "gpu_env_real.sh" if script == "gpu_env.sh" else script
    for flag in ("--help", "-h"):
        res = run_sh(sandbox, name, flag)
        assert res.returncode == 0, f"{script} {flag}: rc {res.returncode}\n{res.stderr}"
        assert res.stdout.strip() == header(script).strip()
    assert not INTERNAL.search(header(script)), f"{script}: the header cites an internal work item"
    for var in shell_variable_reads((SCRIPTS / script).read_text()):
        assert var in header(script), f"{script} reads ${var} but its header does not say so"


@pytest.mark.parametrize("script,var", sorted(SH_REQUIRED_VAR.items()))
def test_shell_script_without_its_variable_stops_with_one_line(script, var, sandbox):
    res = run_sh(sandbox, script, drop=(var,))
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and var in lines[0], (res.returncode, lines)
    assert not (sandbox / var).exists()


@pytest.mark.parametrize("script", SH_REQUIRED_ARGS)
def test_shell_script_without_arguments_stops_with_usage(script, sandbox):
    res = run_sh(sandbox, script)
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("usage:"), (res.returncode, lines)


def test_gpu_env_run_instead_of_sourced_says_so(sandbox):
    res = run_sh(sandbox, "gpu_env_real.sh")
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "source" in lines[0], (res.returncode, lines)
    assert not (sandbox / "site").exists()


def test_shell_variable_reads():
    src = 'set -u\nRES=${RES:-/tmp/x}\nM=.gpu\necho "$M $OUT ${PYTHONPATH:+x} $PATH"\n# $IGNORED in a comment\n'
    assert shell_variable_reads(src) == {"RES", "OUT", "PYTHONPATH"}
