"""The package layout is the architecture: the import contract in setup.cfg holds, and it can fail.

``lint-imports`` (import-linter) checks the layers (a lower layer never imports a higher one), the
forbidden imports (policy apart from mechanism, a lean prestop client) and that no package has an
import cycle among its children. Function-level imports count, so a cycle cannot hide in a function.
"""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import importlinter  # noqa: F401  (the test extra installs it: without it this file fails, never skips)
import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='setup.cfg', no_cache=True, no_logo=True))")
#: The layers, top to bottom, as docs/architecture.md and the setup.cfg contract name them.
LAYERS = ("commands", "run", "control", "restore", "cluster", "supervision", "monitoring", "jobspec", "common")
#: Subpackages whose __init__ is a public facade (kept from before the regrouping); every other one
#: is a docstring only, so importing one module never loads its siblings.
FACADES = {"launcher/jobspec/ranktable/__init__.py", "launcher/restore/__init__.py"}


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_the_import_contract_holds():
    result = lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "launcher", tmp_path / "launcher", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "setup.cfg", tmp_path / "setup.cfg")
    return tmp_path


@pytest.mark.parametrize("module, line, broken", [
    # A lower layer importing a higher one.
    ("launcher/common/errors.py", "from launcher.run import session", "Layers"),
    ("launcher/jobspec/rankenv.py", "from launcher.supervision import procgroup", "Layers"),
    # Two siblings importing each other (what runner <-> session and parse <-> validate were).
    ("launcher/jobspec/ranktable/walk.py", "from launcher.jobspec.ranktable import parse", "cycles"),
    # The policy reaching for the process mechanism.
    ("launcher/supervision/policy.py", "from launcher.supervision import procgroup", "policy"),
    # The preStop client growing a heavy dependency.
    ("launcher/control/client.py", "import click", "control client"),
    # launcher status's click-free path growing a heavy dependency.
    ("launcher/monitoring/goodput.py", "import click", "launcher status"),
    ("launcher/monitoring/heartbeats.py", "import dataclasses", "launcher status"),
])
def test_a_violation_breaks_the_contract(tmp_path, module, line, broken):
    root = copy_of_the_package(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n\ndef _violation():\n    {line}\n")
    result = lint(root)
    assert result.returncode != 0
    assert broken in result.stdout.split("Broken contracts")[-1]


def test_every_layer_is_a_package_in_the_contract():
    config = (REPO / "setup.cfg").read_text()
    for layer in LAYERS:
        assert (REPO / "launcher" / layer / "__init__.py").is_file()
        assert f"launcher.{layer}" in config


def test_subpackage_inits_are_docstrings_only():
    for init in sorted((REPO / "launcher").rglob("__init__.py")):
        relative = init.relative_to(REPO).as_posix()
        body = ast.parse(init.read_text()).body
        if init.parent == REPO / "launcher" or relative in FACADES:
            continue
        assert ast.get_docstring(ast.Module(body=body, type_ignores=[])), relative
        assert len(body) == 1, f"{relative} must hold only its docstring (what it owns and may import)"
        assert "May import" in body[0].value.value, relative


def test_docs_architecture_matches_the_tree():
    doc = (REPO / "docs" / "architecture.md").read_text()
    for named in re.findall(r"launcher/[\w/]+\.py", doc):
        assert (REPO / named).is_file(), f"docs/architecture.md names {named}, which does not exist"
    modules = [p for p in (REPO / "launcher").rglob("*.py") if p.name != "__init__.py" and "rankhooks" not in p.parts]
    unnamed = [str(p.relative_to(REPO)) for p in modules if f"`{p.name}`" not in doc and p.name != "__main__.py"]
    assert not unnamed, f"docs/architecture.md does not place {unnamed}"
