"""Everything the launcher did not write itself is read by the one reader (issue #27, "fix at the root").

An AST scan of ``launcher/``: a module outside the reader (``launcher.common.inputfiles``,
``inputrecords``, ``inputyaml``) that parses JSON or YAML, or opens a file for reading, fails this test
unless it is in :data:`ALLOWED` with the reason it is safe. A new reader of a peer's record, a run-dir
file or a cluster report must go through ``read_json`` / ``read_record`` / ``loads_json`` /
``JsonLines`` / ``read_yaml`` instead (docs/inputs.md), or be added here with a reason a reviewer
can check.

Writes (``open(path, "w")``) are not reads; the ranks' side (``launcher/rankhooks``, imported inside
the rank processes) is not the launcher.
"""

import ast
from pathlib import Path
from typing import Iterator, Tuple

REPO = Path(__file__).resolve().parents[2]
READER = {"launcher/common/inputfiles.py", "launcher/common/inputrecords.py", "launcher/common/inputyaml.py"}
PARSERS = {"json.load", "json.loads", "yaml.load", "yaml.safe_load", "yaml.full_load", "yaml.unsafe_load",
           "pickle.load", "pickle.loads", "marshal.loads"}
OPENERS = {"open", "io.open", "os.fdopen", "builtins.open"}
PATH_READS = {"read_text", "read_bytes"}

#: ``path:function:call`` -> why it is not input the launcher must distrust.
ALLOWED = {
    # The sidecar's config: a command-line argument this launcher composed (json.dumps) itself.
    "launcher/cluster/taskd_sidecar.py:main:json.loads": "written by this launcher",
    # /proc/self/mountinfo and /proc/<pid>/stat: the kernel's files.
    "launcher/common/filewatch.py:shared_file_system:open": "kernel",
    "launcher/monitoring/status.py:_proc_state:open": "kernel",
    "launcher/run/devicewait.py:_name:open": "kernel",
    # JSON schemas shipped inside the package.
    "launcher/common/resources.py:load_schema:open": "shipped with the launcher",
    "launcher/common/resources.py:load_schema:json.load": "shipped with the launcher",
    "launcher/restore/groupinfo.py:file_descriptor_proto:read_text": "shipped with the launcher",
    # The ranks' logs and py-spy's dumps: files this launcher creates and writes (tail reads, bounded).
    "launcher/monitoring/errorfile.py:last_traceback:open": "written by this launcher",
    "launcher/supervision/output.py:tail_lines:open": "written by this launcher",
    "launcher/run/stackdump.py:_read:open": "written by this launcher",
    # A descriptor from launcher.common.inputfiles.open_regular (regular file, no FIFO), streamed.
    "launcher/restore/ckptnames.py:verify_digest:os.fdopen": "opened by the reader",
    "launcher/restore/mstransform.py:_file_digest:os.fdopen": "opened by the reader",
}


def _mode(call: ast.Call) -> str:
    """The mode an ``open``-like call passes ("r" when none, "?" when not a literal)."""
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return "r"
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "?"


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"{func.value.id}.{func.attr}" if isinstance(func.value, ast.Name) else func.attr
    return ""


def reads(path: Path) -> Iterator[Tuple[int, str, str]]:
    """``(line, function, call)`` for each parse or read-open in the module ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                functions.setdefault(id(inner), node.name)  # ast.walk is breadth-first: outermost first
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None  # Path(...).read_text()
        if method in PATH_READS:
            yield node.lineno, functions.get(id(node), "<module>"), method
        elif name in PARSERS or (name in OPENERS and ("r" in _mode(node) or "+" in _mode(node) or _mode(node) == "?")):
            yield node.lineno, functions.get(id(node), "<module>"), name


def found() -> dict:
    hits = {}
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel in READER or "rankhooks" in path.parts:
            continue
        for line, function, call in reads(path):
            hits.setdefault(f"{rel}:{function}:{call}", []).append(line)
    return hits


def test_only_the_reader_parses_or_opens_what_the_launcher_did_not_write():
    unexpected = {key: lines for key, lines in found().items() if key not in ALLOWED}
    assert not unexpected, ("read without the one reader (launcher.common.inputfiles; docs/inputs.md), or add "
                            f"it to ALLOWED with the reason it is safe: {unexpected}")


def test_the_allow_list_has_no_stale_entries():
    stale = sorted(set(ALLOWED) - set(found()))
    assert not stale, f"ALLOWED names reads that are gone: {stale}"


def test_the_scan_sees_what_it_must(tmp_path):
    """The scan itself can fail: each kind of read in a module is found."""
    module = tmp_path / "m.py"
    module.write_text("import json, yaml\n"
                      "def a(p):\n    return json.load(open(p))\n"
                      "def b(p):\n    with open(p, 'rb') as f:\n        return yaml.safe_load(f)\n"
                      "def c(p):\n    return p.read_text()\n"
                      "def d(p):\n    open(p, 'w').write('x')\n")
    assert sorted((f, c) for _, f, c in reads(module)) == [("a", "json.load"), ("a", "open"), ("b", "open"),
                                                            ("b", "yaml.safe_load"), ("c", "read_text")]
