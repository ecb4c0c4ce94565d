"""Settings written once: a config dataclass field carries its command-line option.

A field made with `setting(default, help=...)` is an option of the command that builds its config;
its metadata says how the option reads (type, choices, flag, metavar, group). A field made the plain
way (`x: int = 3`) is a Python-API-only setting. `add_settings` adds a dataclass's options to an
argparse parser, `config_from_args` builds the dataclass from the parsed namespace, so an option's
default is the field's default and is written nowhere else.

How a field becomes an option:

- the flag is `--name-with-dashes` unless `flag` says otherwise; a `flag` without a leading dash is a
  positional argument (`nargs="?"`, the field's default when left out);
- a field without a default is a required option;
- a bool defaulting to False is a `store_true` switch; one defaulting to True is a `--no-x` switch
  when `flag` names one (`store_false`), else a `--x/--no-x` pair;
- `choices` given as a mapping {word typed: field value} shows the words and stores their values;
- `nargs="+"` takes a list, stored as a tuple when the field's default is one;
- `parse` turns what the command line collected (with `repeat`: the list of every use of the flag,
  e.g. `-D n=8 -D r=4`) into the field's value; left out, the field keeps its default;
- fields sharing an `exclusive` name form a required mutually exclusive group (give exactly one);
- `group` is an argparse argument group's (title, description), shown as its own `--help` section.

Imports nothing heavy: the command line builds its parsers from the dataclasses without torch.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Mapping

__all__ = ["setting", "options", "add_settings", "config_from_args"]

_KEY = "mtpc.option"  # the metadata key of a field's option; fields without it are not options


def setting(default: Any = dataclasses.MISSING, *, help: str, factory: Callable[[], Any] | None = None,
            type: Callable[[str], Any] | None = None, choices: tuple | Mapping | None = None,
            flag: str | None = None, metavar: str | None = None, nargs: str | None = None,
            group: tuple[str, str] | None = None, exclusive: str | None = None,
            parse: Callable[[Any], Any] | None = None, repeat: bool = False) -> Any:
    """A dataclass field that is also a command-line option (see the module docstring)."""
    option = {"help": help, "type": type, "choices": choices, "flag": flag, "metavar": metavar, "nargs": nargs,
              "group": group, "exclusive": exclusive, "parse": parse, "repeat": repeat}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={_KEY: option})
    return dataclasses.field(default=default, metadata={_KEY: option})


def options(config: type) -> list[dataclasses.Field]:
    """The fields of a config dataclass that are command-line options, in field order."""
    return [f for f in dataclasses.fields(config) if _KEY in f.metadata]


def _default(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one from its factory); MISSING when the field has none."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _flag(f: dataclasses.Field) -> str:
    """The option string of a field: its `flag`, else `--` and the name with dashes."""
    return f.metadata[_KEY]["flag"] or "--" + f.name.replace("_", "-")


def _argument(f: dataclasses.Field) -> tuple[list[str], dict]:
    """(option strings, add_argument keywords) of one option field."""
    option, default, flag = f.metadata[_KEY], _default(f), _flag(f)
    kwargs: dict[str, Any] = {"help": option["help"]}
    if not flag.startswith("-"):
        return [f.name], {**kwargs, "nargs": "?", "default": default, "metavar": option["metavar"]}
    kwargs["dest"] = f.name
    if option["parse"] is not None:  # None: not given (the field's default); anything else goes through parse
        default = None
        if option["repeat"]:
            kwargs["action"] = "append"
    if isinstance(default, bool):
        if not default:
            return [flag], {**kwargs, "action": "store_true", "default": False}
        if flag.startswith("--no-"):
            return [flag], {**kwargs, "action": "store_false", "default": True}
        return [flag], {**kwargs, "action": argparse.BooleanOptionalAction, "default": True}
    choices = option["choices"]
    if isinstance(choices, Mapping):  # the words typed; the default is the word standing for the field's default
        words = [word for word, value in choices.items() if value == default]
        if len(words) != 1:
            raise ValueError(f"{f.name}: the default {default!r} must be exactly one of the values of {dict(choices)}")
        default, choices = words[0], tuple(choices)
    for key in ("type", "metavar", "nargs"):
        if option[key] is not None:
            kwargs[key] = option[key]
    if choices is not None:
        kwargs["choices"] = choices
    if default is dataclasses.MISSING:
        return [flag], {**kwargs, "required": option["exclusive"] is None}
    return [flag], {**kwargs, "default": default}


def add_settings(parser: argparse.ArgumentParser, config: type) -> None:
    """Add every option field of `config` to `parser` (sections and exclusive groups as their metadata says)."""
    sections: dict[tuple[str, str], Any] = {}
    exclusive: dict[str, Any] = {}
    for f in options(config):
        option = f.metadata[_KEY]
        target = parser
        if option["group"] is not None:
            if option["group"] not in sections:
                sections[option["group"]] = parser.add_argument_group(*option["group"])
            target = sections[option["group"]]
        if option["exclusive"] is not None:
            if option["exclusive"] not in exclusive:
                exclusive[option["exclusive"]] = target.add_mutually_exclusive_group(required=True)
            target = exclusive[option["exclusive"]]
        names, kwargs = _argument(f)
        target.add_argument(*names, **kwargs)


def config_from_args(config: type, args: argparse.Namespace, **given: Any):
    """`config` built from the parsed options of its fields; `given` fills the rest (fields the command
    line reads its own way); the Python-API-only fields keep their defaults."""
    values = dict(given)
    for f in options(config):
        value = getattr(args, f.name)
        option = f.metadata[_KEY]
        choices = option["choices"]
        if option["parse"] is not None:
            if value is None:
                continue
            value = option["parse"](value)
        elif isinstance(choices, Mapping):
            value = choices[value]
        elif isinstance(value, list) and isinstance(_default(f), tuple):
            value = tuple(value)
        values[f.name] = value
    return config(**values)
