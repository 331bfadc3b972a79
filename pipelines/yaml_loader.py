"""Reads every YAML file of ratebeam (ratebeam.yaml, metrics.yml, runner configs) the same way.

``yaml.safe_load`` semantics, except that a key repeated in one mapping is refused with both lines
(PyYAML silently keeps the last one, so a typo'd second ``fetcher:`` would win unnoticed).  Every
failure is an ``InputError`` naming the file and the line — also what PyYAML lets escape as Python
errors: nesting deeper than its recursive composer can follow (``RecursionError``) and an integer
longer than Python converts from text (``ValueError``, over 4,300 digits).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from ratebeam.pipelines.errors import InputError


class _DuplicateKeyError(Exception):
    def __init__(self, key: object, mark: yaml.Mark, first: yaml.Mark) -> None:
        super().__init__(key)
        self.key, self.mark, self.first = key, mark, first


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a key repeated in one mapping instead of keeping the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # unhashable key: the base class reports it
                continue
            if first is not None:
                raise _DuplicateKeyError(key, key_node.start_mark, first)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path, source: str | None = None) -> Any:
    """The YAML document at ``path`` (safe loader, duplicate keys refused); errors name ``source``."""
    source = str(path) if source is None else source
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(source, "(file)", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(source, "(file)", "not UTF-8 text") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: safe_load semantics
    except _DuplicateKeyError as exc:
        raise InputError(
            source,
            f"line {exc.mark.line + 1}, column {exc.mark.column + 1}",
            f"duplicate key (first at line {exc.first.line + 1})",
            exc.key,
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        location = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        raise InputError(source, location, f"invalid YAML: {exc.problem or exc.context}") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (a NUL, a control character)
        raise InputError(source, f"character {exc.position + 1}", f"invalid YAML: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise InputError(source, "(file)", f"invalid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise InputError(source, "(file)", "nested too deeply (lists or mappings inside each other)") from None
    except ValueError:  # int() of a scalar over sys.get_int_max_str_digits() digits
        raise InputError(source, "(file)", f"a number has more than {sys.get_int_max_str_digits()} digits") from None
