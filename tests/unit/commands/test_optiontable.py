"""The option table (``launcher.commands.optiontable``) is the one source of ``launcher run``'s options:
the click options, the help sections, ``LAUNCHER_*`` variables, the config schema and ``RunOptions``
all agree with it, and the drifts it replaced stay fixed (``metrics_port`` in a config file,
``--checkpoint-marker`` on ``run``)."""

import dataclasses
import json

import click
import pytest

from launcher.commands import optiontable
from launcher.commands.cli import main
from launcher.commands.optiontypes import ParsedType
from launcher.jobspec.options import RunOptions, load_config
from tests.helpers.paths import REPO

#: RunOptions fields that no launcher option sets directly: the command and what torchrun's and
#: msrun's options map onto.
DERIVED_FIELDS = {"command", "min_nodes", "rank_env", "extra"}
#: Launcher options consumed in the command layer (they shape ``command``), not RunOptions fields.
COMMAND_LAYER = {"config", "no_python", "module"}


@pytest.fixture(autouse=True)
def _isolated(clean_env, restore_launcher_logger, monkeypatch, tmp_path):
    monkeypatch.setenv("LAUNCHER_RUN_DIR", str(tmp_path / "run"))


def test_the_schema_file_is_the_one_the_table_generates():
    """``python -m launcher.commands.optiontable > schemas/launcher.schema.json`` after changing a row."""
    assert (REPO / "schemas" / "launcher.schema.json").read_text() == optiontable.schema_text()


def parsed_default(row):
    """The value ``RunOptions`` holds when the option is not given: parsed once, at the edge."""
    if row.type is optiontable.FLAG:
        return False
    if isinstance(row.type, ParsedType):
        return row.type.empty if row.default is None else row.type.convert(row.default, None, None)
    return row.default


def test_every_launcher_option_is_a_run_options_field_with_the_same_default():
    fields = {f.name: f for f in dataclasses.fields(RunOptions)}
    rows = [row for row in optiontable.ROWS if not row.foreign or row.handling == optiontable.NOT_YET]
    for row in rows:
        if row.name in COMMAND_LAYER:
            continue
        assert row.name in fields, f"option {row.flag} has no RunOptions field {row.name}"
        assert fields[row.name].default == parsed_default(row), row.name
    assert set(fields) - DERIVED_FIELDS == {row.name for row in rows} - COMMAND_LAYER


def test_every_row_is_one_click_option_with_its_env_var_and_section():
    from launcher.commands.run import run

    options = {p.name: p for p in run.params if isinstance(p, click.Option)}
    for row in optiontable.ROWS:
        param = options[row.name] if row.name != "config" else next(p for p in run.params if "--config" in p.opts)
        assert param.hidden == (row.section is None), row.name
        if row.envvar():
            assert param.envvar == f"LAUNCHER_{row.name.upper()}"
        elif row.name != "config":
            assert not param.envvar, row.name
    listed = [name for _title, names in optiontable.help_sections() for name in names]
    assert sorted(listed) == sorted(set(listed))
    assert [title for title, _ in optiontable.help_sections()] == list(optiontable.SECTIONS)


def test_foreign_rows_say_what_happens():
    for row in optiontable.ROWS:
        if row.foreign and row.handling != optiontable.NOT_YET:
            assert (row.torchrun or row.msrun) and row.tool in ("torchrun", "msrun"), row.name
            assert not row.config and not row.envvar(), row.name
        if row.handling in (optiontable.INFO, optiontable.REFUSED, optiontable.NOT_YET, optiontable.MAPPED):
            assert row.note, row.name
        if row.msrun:
            assert "_" in row.msrun or row.msrun.count("-") == 2, row.msrun  # msrun spells with underscores


def test_every_config_key_of_the_table_loads(tmp_path):
    """The README says the config file holds any run option: each key of the table is accepted."""
    samples = {"integer": 1, "number": 0.5, "boolean": True, "string": "x", "array": ["a=1"]}
    for name, schema in optiontable.json_schema()["properties"].items():
        kind = schema.get("type", "string")
        value = schema["enum"][0] if "enum" in schema else samples[kind if isinstance(kind, str) else kind[0]]
        value = schema.get("minimum", value)
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps({name.replace("_", "-"): value}))
        assert load_config(str(path)) == {name: value}, name


def test_metrics_port_and_checkpoint_marker_from_a_config_file(capsys, tmp_path, monkeypatch):
    import launcher.run.runner

    seen = []
    monkeypatch.setattr(launcher.run.runner, "execute", lambda opts: seen.append(opts) or 0)
    config = tmp_path / "run.yaml"
    config.write_text("metrics_port: 0\nmetrics-textfile: /tmp/m.prom\ncheckpoint_marker: '{name}.sha256'\n")
    assert main(["run", "--config", str(config), "--", "true"]) == 0
    assert (seen[0].metrics_port, seen[0].metrics_textfile, seen[0].checkpoint_marker) == \
        (0, "/tmp/m.prom", "{name}.sha256")


def _plan_files(doc):
    return {source["rank"]: source.get("path") for source in doc["restore_plan"]["sources"]}


def test_checkpoint_marker_rules_out_a_checkpoint_without_it(capsys, tmp_path):
    """docs/restore-plan.md: with --checkpoint-marker a checkpoint without its marker file is never picked."""
    ckpt = tmp_path / "ckpt"
    for rank in (0, 1):
        (ckpt / f"rank_{rank}").mkdir(parents=True)
        for step in (10, 20):
            (ckpt / f"rank_{rank}" / f"net-1_{step}.ckpt").write_bytes(b"x" * 8)
        (ckpt / f"rank_{rank}" / "net-1_10.ckpt.done").write_text("")
    args = ["run", "--dry-run", "--json", "--nproc-per-node", "2", "--checkpoint-dir", str(ckpt)]

    def step(*more):
        code = main([*args, *more, "--", "true"])
        out, err = capsys.readouterr()
        assert code == 0, err
        return json.loads(out)["restore_plan"]["step"]

    assert step() == 20
    assert step("--checkpoint-marker", "{name}.done") == 10
    code = main([*args, "--checkpoint-marker", "../x", "--", "true"])
    assert code == 2 and "--checkpoint-marker '../x' must be a plain name" in capsys.readouterr()[1]
