"""``launcher run``'s fast parser (``launcher.commands.fastrun``) gives what the click command gives, or
hands the command line to it: compared on generated command lines (hypothesis), and its index is the one
the option table generates."""

import os
import subprocess
import sys

import click
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from launcher.commands import fastrun, indexgen
from launcher.commands.optionindex import ROWS
from launcher.commands.run import run, run_options
from launcher.commands.runargs import build_run_options
from launcher.common.errors import UsageError
from tests.helpers.paths import REPO

#: Rows the fast parser takes a value of, and what the generated lines may spell them as.
FAST = [row for row in ROWS if row["kind"] is not None and row["exposed"]]
COMMAND = ("/bin/true", "--lr", "0.1")


@pytest.fixture(autouse=True)
def _isolated(clean_env, restore_launcher_logger):
    pass


def test_the_index_is_the_one_the_table_generates():
    assert (REPO / "launcher" / "commands" / "optionindex.py").read_text() == indexgen.index_text()


def click_parse(args):
    """What the click command makes of ``args``: (values, names given), or the error it raises."""
    ctx = run.make_context("run", list(args))
    explicit = [name for name in ctx.params
                if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)]
    return ctx, dict(ctx.params), explicit


def _text(kind, draw, tmp):
    how = kind[0]
    if how == "text":
        return draw(st.text(st.sampled_from("abcXYZ019._:/,@"), min_size=1, max_size=12))
    if how == "count":
        return str(draw(st.integers(1, 64)))
    if how in ("int", "float"):
        candidates = ["0", "1", "2", "5", "10", "93", "255", "300", "65535"] + \
            (["0.5", "2.25", "0.125", "30.0"] if how == "float" else [])
        return draw(st.sampled_from([text for text in candidates if _within(kind[1:], float(text))]))
    if how == "choice":
        return draw(st.sampled_from(kind[1]))
    file_okay, dir_okay = kind[1], kind[2]
    choices = [str(tmp / "absent" / "x")] + ([str(tmp / "a-file")] if file_okay else []) + \
        ([str(tmp)] if dir_okay else [])
    return draw(st.sampled_from(choices))


def _within(bounds, value):
    low, high, low_open, high_open = bounds
    return (low is None or (value > low if low_open else value >= low)) and \
        (high is None or (value < high if high_open else value <= high))


@st.composite
def valid_lines(draw, tmp):
    """A command line of options the fast parser takes, each spelled as a user may spell it."""
    args = []
    for row in draw(st.lists(st.sampled_from(FAST), max_size=6)):
        spelling = draw(st.sampled_from(row["decls"]))
        if spelling.startswith("--") and draw(st.booleans()):
            spelling = spelling.replace("-", "_").replace("__", "--", 1)  # torchrun's --nproc_per_node
        if row["kind"][0] == "flag":
            args.append(spelling)
            continue
        value = _text(row["kind"], draw, tmp)
        args += [f"{spelling}={value}"] if spelling.startswith("--") and draw(st.booleans()) else [spelling, value]
    return args + (["--"] if draw(st.booleans()) else []) + list(COMMAND)


def _same(args):
    fast = fastrun.parse(args, os.environ)
    ctx, values, explicit = click_parse(args)
    return fast, ctx, values, explicit


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_fast_parser_gives_what_click_gives_on_valid_command_lines(data, tmp_path):
    (tmp_path / "a-file").touch()
    args = data.draw(valid_lines(tmp_path))
    fast, ctx, values, explicit = _same(args)
    assert fast is not None, args  # plain forms: it must not hand them on
    assert fast[0] == values and set(fast[1]) == set(explicit)
    try:
        ours = build_run_options(dict(fast[0]), fast[1], os.environ)
    except UsageError as exc:
        with pytest.raises(UsageError) as theirs:
            run_options(ctx)
        assert exc.lines() == theirs.value.lines()
    else:
        assert ours == run_options(ctx)


_TOKENS = st.one_of(st.sampled_from([d for row in ROWS for d in row["decls"]] + ["--help", "-h", "--", "-", "-x",
                                                                                 "--nproc_per_node", "--bogus"]),
                    st.text(st.sampled_from("ab01-=_.:"), max_size=6))


@settings(max_examples=500, deadline=None)
@given(args=st.lists(_TOKENS, max_size=8))
def test_whatever_it_takes_click_takes_the_same_way_and_it_hands_on_the_rest(args):
    fast = fastrun.parse(args, os.environ)
    if fast is None:
        return
    try:
        _ctx, values, explicit = click_parse(args)
    except click.ClickException as exc:  # click refuses it: the fast parser must have handed it on
        raise AssertionError(f"fast parser took {args}, click refuses it: {exc.format_message()}") from None
    assert fast[0] == values and set(fast[1]) == set(explicit)


@pytest.mark.parametrize("args", [
    ["--help"], ["-h"], [], ["--"], ["--nproc-per-node", "0", "x"], ["--nproc-per-node", "auto", "x"],
    ["--master-port", "70000", "x"], ["--standalone=1", "x"], ["--max-restarts"], ["--bogus", "x"],
    ["--framework", "PyTorch", "x"], ["--console-ranks", "0", "x"], ["x", "--max-restarts", "3"],
    ["--master-addr", "-x", "x"], ["-mx", "x"], ["--run-dir", "", "x"]])
def test_it_hands_on_what_it_does_not_fully_understand(args):
    assert fastrun.parse(args, os.environ) is None


def test_it_hands_on_a_command_line_that_an_environment_variable_or_config_file_adds_to(monkeypatch):
    assert fastrun.parse(["x"], os.environ) is not None
    monkeypatch.setenv("LAUNCHER_MAX_RESTARTS", "2")
    assert fastrun.parse(["x"], os.environ) is None
    monkeypatch.delenv("LAUNCHER_MAX_RESTARTS")
    monkeypatch.setenv("LAUNCHER_CONFIG", "/nonexistent.yaml")
    assert fastrun.parse(["x"], os.environ) is None


def test_a_launcher_run_takes_the_fast_path_without_importing_click(tmp_path):
    code = ("import sys\nfrom launcher.__main__ import main\n"
            "try:\n    main(['run', '--nproc_per_node=1', '--run-dir', sys.argv[1], '--', 'true'])\n"
            "except SystemExit as exc:\n    print(exc.code, 'click' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCHER_")}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.stdout.strip() == "0 False", proc.stderr


def test_a_plain_run_leaves_out_the_modules_only_rare_paths_need(tmp_path):
    """Each costs every launch about a millisecond or more before the first rank starts: OpenSSL's
    hashlib (the run id's SHA-256 comes from CPython's own module), platform (TaskD's install hint),
    the idna codec (free_port's address is ASCII)."""
    rare = ("_hashlib", "platform", "encodings.idna", "stringprep")
    code = ("import sys\nfrom launcher.__main__ import main\n"
            "try:\n    main(['run', '--nproc-per-node', '2', '--run-dir', sys.argv[1], '--', 'true'])\n"
            f"except SystemExit as exc:\n    print(exc.code, sorted(m for m in {rare!r} if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCHER_")}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.stdout.strip() == "0 []", proc.stderr

def test_a_mistake_still_gets_clicks_message_and_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCHER_")}
    proc = subprocess.run([sys.executable, "-m", "launcher", "run", "--nproc-per-node", "0", "true"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    assert "Invalid value for '--nproc-per-node'" in proc.stderr and "Traceback" not in proc.stderr
