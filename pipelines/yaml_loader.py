"""Reads every YAML file of ratebeam (ratebeam.yaml, metrics.yml, runner configs) the same way.

``yaml.safe_load`` semantics, except that a key repeated in one mapping is refused with both lines
(PyYAML silently keeps the last one, so a typo'd second ``fetcher:`` would win unnoticed).  Every
failure is an ``InputError`` naming the file and the line — also what PyYAML lets escape as Python
errors: nesting deeper than its recursive composer can follow (``RecursionError``) and an integer
longer than Python converts from text (over 4,300 digits: named by line, column and key path).

A float whose text is a finite number other than 0 but which a float cannot hold (``1.0e-400``
would be 0.0, ``1.0e+400`` inf) is refused the same way: no setting of ratebeam or metrics.yml
means it, and as 0.0 a ``factor`` silently bills nothing.
"""

from __future__ import annotations

import math
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

from ratebeam.pipelines.errors import InputError


class _DuplicateKeyError(Exception):
    def __init__(self, key: object, mark: yaml.Mark, first: yaml.Mark) -> None:
        super().__init__(key)
        self.key, self.mark, self.first = key, mark, first


class _NumberError(Exception):
    """A number scalar no Python number holds as written: where it is (its node) and why."""

    def __init__(self, node: yaml.Node, message: str, value: object = None) -> None:
        super().__init__(message)
        self.node, self.message, self.value = node, message, value
        #: The document's root node, set once the error leaves the construction (``_load``).
        self.root: yaml.Node | None = None


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``, refusing a repeated key and a number no Python number holds as written.

    PyYAML keeps the last of two keys; its numbers raise ``_NumberError`` here, with their node.
    """

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # int() of a text over sys.get_int_max_str_digits() digits
            raise _NumberError(node, f"a number has more than {sys.get_int_max_str_digits()} digits") from None

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        number = super().construct_yaml_float(node)
        if number == 0 or math.isinf(number):
            try:
                exact = Decimal(node.value.replace("_", ""))
            except InvalidOperation:  # .inf, a sexagesimal float: written as what it is
                return number
            if exact.is_finite() and exact != 0:
                why = ("not 0, but a float cannot hold it (it would be 0.0)" if number == 0 else
                       f"too large for a float (it would be {number})")
                raise _NumberError(node, why, node.value)
        return number

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


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _UniqueKeyLoader.construct_yaml_float)


def _load(text: str) -> Any:
    """``yaml.load`` with the loader above; a ``_NumberError`` leaves with the document's root node."""
    loader = _UniqueKeyLoader(text)
    try:
        root = loader.get_single_node()
        try:
            return None if root is None else loader.construct_document(root)
        except _NumberError as exc:
            exc.root = root
            raise
    finally:
        loader.dispose()


def _path_of(root: yaml.Node, target: yaml.Node) -> str:
    """The key path of ``target`` under ``root`` (``metrics.cpu.factor``; a mapping key: its mapping's).

    Walked over the composed nodes, each once (an alias shares its anchor's node: a YAML bomb is
    a few nodes), with a stack rather than recursion (the document may nest as deep as PyYAML allowed).
    """
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    seen: set[int] = set()
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                if key is target:
                    return path
                name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                stack.append((value, f"{path}.{name}" if path else str(name)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in reversed(list(enumerate(node.value))))
    return ""


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
        return _load(text)
    except _NumberError as exc:
        mark = exc.node.start_mark
        path = _path_of(exc.root, exc.node) if exc.root is not None else ""
        location = f"line {mark.line + 1}, column {mark.column + 1}" + (f": {path}" if path else "")
        if exc.value is None:
            raise InputError(source, location, exc.message) from None
        raise InputError(source, location, exc.message, exc.value) from None
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
