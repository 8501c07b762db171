"""Fuzzed configuration through the CLI's ``main``, in-process: whatever a run config, a ``--set`` or a stack file
holds (wrong types, numbers out of range or huge, NaN, odd Unicode, unknown keys, a section replaced by a scalar or a
list), the command either validates or fails with one line naming a key that is in the config or in the input,
exit 2; never a traceback. Run configs go through ``spotray submit --dry-run`` on the dev stack (read, validated,
checked against the stack; nothing runs), stack files through ``spotray pulumi-env`` (the whole stack is read).
Derandomized, so that CI runs the same 150 examples every time; ``SPOTRAY_FUZZ_EXAMPLES=5000`` runs that many new
ones (random) instead."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
import typing
from pathlib import Path

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from infra.cli import main
from spotray import config
from spotray.errors import key_text
from tests.repo import REPO, STACKS

ERROR = re.compile(r"spotray: error: config '(.*)': ")
MORE = int(os.environ.get("SPOTRAY_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=MORE or 150, deadline=None, derandomize=not MORE, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
UNKNOWN = "zz_unknown"
ODD_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
NUMBERS = st.one_of(st.integers(), st.integers(min_value=-(2**80), max_value=2**80),
                    st.floats(allow_nan=True, allow_infinity=True))
VALUES = st.one_of(st.none(), st.booleans(), NUMBERS, ODD_TEXT, st.lists(NUMBERS | ODD_TEXT, max_size=3),
                   st.dictionaries(ODD_TEXT | st.integers(), NUMBERS | ODD_TEXT, max_size=2))
SET_TEXT = st.one_of(ODD_TEXT, NUMBERS.map(str), st.sampled_from(["true", "null", "[1, 2]", "{a: 1}", "1e999", ".nan"]))


def _run_keys(cls: type, prefix: str = "") -> list[str]:
    """Every key and section of a run config, dotted, as a config file spells them."""
    keys = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        key = prefix + {v: k for k, v in config._YAML_ALIASES.items()}.get(field.name, field.name)
        keys.append(key)
        if dataclasses.is_dataclass(hints[field.name]):
            keys += _run_keys(hints[field.name], key + ".")
    return keys


def _tree_keys(tree: object, prefix: str = "") -> list[str]:
    """Every dotted key of a mapping (list items as ``key[i]``), spelled as an error line names it."""
    keys = []
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in items:
        path = f"{prefix}[{key}]" if isinstance(tree, list) else f"{prefix}{'.' if prefix else ''}{key_text(key)}"
        keys += [path, *_tree_keys(value, path)]
    return keys


RUN_KEYS = _run_keys(config.TrainConfig)
STACK_TREES = [yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"] for stack in STACKS]
STACK_KEYS = sorted({key for tree in STACK_TREES for key in _tree_keys(tree) if "[" not in key})


def _put(tree: dict, dotted: list, value: object) -> None:
    *parents, last = dotted
    for part in parents:
        if not isinstance(tree.get(part), dict):
            tree[part] = {}
        tree = tree[part]
    tree[last] = value


def _named(err: str, code: int) -> str | None:
    """The key an error line names; None where the command succeeded. Fails on anything but one ConfigError line."""
    assert "Traceback" not in err, err
    event(f"exit {code}")  # pytest --hypothesis-show-statistics: how many validated, how many were refused
    if code == 0:
        return None
    lines = [line for line in err.splitlines() if line.startswith("spotray: error:")]
    assert code == 2 and len(lines) == 1, (code, err)
    named = ERROR.match(lines[0])
    assert named, lines[0]
    return named.group(1)


def _is_key_of(named: str, known: list[str], written: list[str]) -> bool:
    """A key of the config, or one the input holds, or a part of one of them (a list item, a map key)."""
    keys = {*known, *written, "<root>", "--config", "--set", "config"}
    return named in keys or any(named.startswith((f"{key}.", f"{key}[")) for key in keys)


@FUZZ
@given(data=st.data())
def test_any_run_config_validates_or_fails_in_one_line_naming_its_key(data, capsys):
    raw: dict = {}
    for key in data.draw(st.lists(st.sampled_from(RUN_KEYS), max_size=3, unique=True), label="keys"):
        _put(raw, key.split("."), data.draw(VALUES, label=key))
    if data.draw(st.booleans(), label="unknown key"):
        _put(raw, [*data.draw(st.sampled_from(["", *RUN_KEYS])).split(".")[:-1], UNKNOWN], 1)
    sets = data.draw(st.lists(st.tuples(st.sampled_from([*RUN_KEYS, f"train.{UNKNOWN}"]), SET_TEXT), max_size=2),
                     label="--set")
    with tempfile.TemporaryDirectory() as scratch:
        file = Path(scratch, "run.yaml")
        file.write_text(yaml.safe_dump(raw, allow_unicode=True))
        code = main(["submit", "--stack", "dev", "--config", str(file), *(f"--set={k}={v}" for k, v in sets),
                     "--dry-run", "--project-dir", str(REPO)])
    named = _named(capsys.readouterr().err, code)
    assert named is None or _is_key_of(named, RUN_KEYS, _tree_keys(raw) + [k for k, _ in sets]), named


SHAPES = st.sampled_from(["mapping", "config is a list", "document is a list", "not YAML"])


@FUZZ
@given(data=st.data())
def test_any_stack_file_is_read_or_refused_in_one_line_naming_its_key(data, capsys):
    tree = yaml.safe_load(yaml.safe_dump(data.draw(st.sampled_from(STACK_TREES), label="stack")))
    for key in data.draw(st.lists(st.sampled_from(STACK_KEYS), max_size=3, unique=True), label="keys"):
        _put(tree, key.split("."), data.draw(VALUES, label=key))
    if data.draw(st.booleans(), label="unknown key"):
        _put(tree, [*data.draw(st.sampled_from(STACK_KEYS)).split(".")[:-1], UNKNOWN], 1)
    shape = data.draw(SHAPES, label="shape")
    text = {"mapping": yaml.safe_dump({"config": tree}, allow_unicode=True),
            "config is a list": yaml.safe_dump({"config": [tree]}), "document is a list": yaml.safe_dump([tree]),
            "not YAML": "config: [\n"}[shape]
    with tempfile.TemporaryDirectory() as project:
        shutil.copy(REPO / "Pulumi.yaml", project)
        Path(project, "Pulumi.fuzz.yaml").write_text(text)
        code = main(["pulumi-env", "--stack", "fuzz", "--project-dir", project])
    named = _named(capsys.readouterr().err, code)
    assert named is None or _is_key_of(named, STACK_KEYS, _tree_keys(tree)), named


def test_the_fuzzing_finds_a_traceback_where_there_is_one(monkeypatch, capsys):
    """The checks above fail on an error that escapes as a traceback."""
    def broken(values):
        raise TypeError("'<' not supported between instances of 'int' and 'str'")

    monkeypatch.setattr("infra.kernel.config._stack_values", broken)
    try:
        main(["pulumi-env", "--stack", "dev", "--project-dir", str(REPO)])
    except TypeError:
        return
    raise AssertionError("a TypeError in reading a stack went unnoticed")
