"""Reading YAML with line numbers, safely.

PyYAML's safe composer gives a node tree with positions; this module turns it into
plain Python while recording, for every key path, the line it was written on, so that
a validation error can name the file, line and key.  It refuses what a config file
never needs and an attacker would use, each with a message naming the limit: a file of
more than ``MAX_BYTES``, collections nested deeper than ``MAX_DEPTH`` (checked on the
parser's events, before the recursive composer could overflow the stack), more than
``MAX_NODES`` values, as written or after alias expansion (an "alias bomb" of nested
anchors), recursive aliases and duplicate keys.

Numbers are read as YAML 1.2 reads them: ``1e-3`` and ``1.0e4`` are floats (YAML 1.1,
PyYAML's default, needs a dot and a signed exponent and reads them as strings).

>>> doc = load_text("a: 1\\nb:\\n  c: [x, y]\\n", "s.yaml")
>>> doc.data, doc.line(("b", "c", 1))
({'a': 1, 'b': {'c': ['x', 'y']}}, 3)
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_NODES = 10_000
MAX_BYTES = 1_000_000  # a search space is a few hundred bytes; 1 MB is a mistake
MAX_DEPTH = 64  # nested mappings and lists (a space needs 4)


class _Loader(yaml.SafeLoader):
    """The safe loader, with YAML 1.2's floats (``1e-3``, ``1.0e4``, ``5.``) and
    booleans (``true``/``false``; ``yes`` and ``on`` are strings)."""


# YAML 1.2's core schema over PyYAML's 1.1 resolvers.  Booleans are true and false only:
# 1.1 also reads yes, no, on, off, y and n, so a choice of country codes [se, no] or a
# flag written ``yes`` would change type silently; here they are strings, and a flag
# given one is refused by name.  Dates are strings too (1.1 makes datetime objects,
# which no parameter takes and no study can store).
# Integers and floats are 1.2's too: decimal, 0o octal and 0x hex integers only, so 1.1's
# forms (1_000, sexagesimal 1:30 = 90, 010 = 8, 0b1) are strings, refused wherever a
# number belongs rather than read as another number.
_BOOL, _STAMP = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp"
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL, _STAMP, _INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_INT_TEXT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_Loader.add_implicit_resolver(_INT, _INT_TEXT, list("-+0123456789"))
_FLOAT_TEXT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                         r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_Loader.add_implicit_resolver(_FLOAT, _FLOAT_TEXT, list("-+0123456789."))


def _int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """A 1.2 integer: ``010`` is ten (1.1 read it as octal 8)."""
    text = str(loader.construct_scalar(node))
    if not _INT_TEXT.match(text):  # an explicit !!int of another form
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} is not a YAML 1.2 integer (decimal, 0o octal or 0x hex)",
            node.start_mark)
    if text.startswith(("0o", "0x")):
        return int(text, 0)
    return int(text, 10)


def _float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    """A 1.2 float (an explicit ``!!float 1_0.5`` is refused, not read as 10.5)."""
    text = str(loader.construct_scalar(node))
    if not _FLOAT_TEXT.match(text):
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} is not a YAML 1.2 number", node.start_mark)
    return float(loader.construct_yaml_float(node))


_Loader.add_constructor(_INT, _int)
_Loader.add_constructor(_FLOAT, _float)
_SEQ, _MAP = "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"
# the core schema's scalars; an explicit !!binary or !!timestamp makes bytes or a date
_SCALARS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null")}

Loc = tuple[str | int, ...]


@dataclass
class SourceError:
    """One problem in a file: where, and what."""

    file: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        at = f"{self.file}:{self.line}" if self.line else self.file
        return f"{at}: {self.key}: {self.message}" if self.key else f"{at}: {self.message}"


class SpaceError(Exception):
    """A file that cannot be used, with every problem found in it."""

    def __init__(self, errors: list[SourceError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass
class Document:
    data: Any
    file: str
    lines: dict[Loc, int] = field(default_factory=dict)

    def line(self, loc: Loc) -> int | None:
        """The line of ``loc``, or of its nearest enclosing key."""
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return self.lines.get((), None)


def _too_big(file: str, size: int) -> SpaceError:
    return SpaceError([SourceError(file, None, "", f"the file has {size:,} bytes, more than "
                                   f"the {MAX_BYTES:,} a search space may have")])


def load_file(path: str | Path) -> Document:
    p = Path(path)
    try:
        if p.is_file() and (size := p.stat().st_size) > MAX_BYTES:
            raise _too_big(str(p), size)
        # Opened without blocking and checked before reading: a FIFO's open or read
        # would wait for a writer forever, a device could be read forever.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:  # a file that grows reads no further
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SpaceError([SourceError(str(p), None, "", "not a regular file (a "
                                              "FIFO, device or socket): give a YAML "
                                              "file")])
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise _too_big(str(p), len(raw))
        text = raw.decode("utf-8")
    except OSError as e:
        raise SpaceError([SourceError(str(p), None, "", f"cannot read the file: "
                                      f"{e.strerror or e}")]) from None
    except UnicodeDecodeError as e:
        raise SpaceError([SourceError(str(p), None, "", f"not UTF-8 text: {e}")]) from None
    return load_text(text, str(p))


def _scan(text: str, file: str) -> bool:
    """Refuse too deep a nesting, or too many values as written, from the parser's events
    (no recursion, nothing built); whether the text has aliases."""
    depth = count = 0
    aliases = False
    for event in yaml.parse(text, Loader=_Loader):
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpaceError([SourceError(file, line, "",
                                              f"nested more than {MAX_DEPTH} levels deep; a "
                                              "search space needs a few")])
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases = True
        if isinstance(event, yaml.NodeEvent):
            count += 1
            if count > MAX_NODES:
                raise SpaceError([SourceError(file, line, "",
                                              f"more than {MAX_NODES:,} values; a search "
                                              "space is far smaller")])
    return aliases


def load_text(text: str, file: str = "<text>") -> Document:
    if len(text) > MAX_BYTES and len(text.encode("utf-8")) > MAX_BYTES:
        raise _too_big(file, len(text.encode("utf-8")))
    try:
        aliases = _scan(text, file)
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        msg = " ".join(x for x in (e.context, e.problem) if x) or str(e)
        if e.context_mark is not None and mark is not None and \
                e.context_mark.line != mark.line:
            msg += f" (the construct began on line {e.context_mark.line + 1})"
        raise SpaceError([SourceError(file, line, "", f"YAML syntax: {msg}")]) from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow: its line
        line = text.count("\n", 0, e.position) + 1
        raise SpaceError([SourceError(file, line, "", f"YAML: character {e.character!r} "
                                      "is not allowed in a YAML file")]) from None
    except yaml.YAMLError as e:
        raise SpaceError([SourceError(file, None, "", f"YAML: {e}")]) from None
    except RecursionError:  # pragma: no cover (_scan refuses the depth first)
        raise SpaceError([SourceError(file, None, "", f"nested more than {MAX_DEPTH} "
                                      "levels deep")]) from None
    doc = Document(None, file)
    if node is None:
        raise SpaceError([SourceError(file, 1, "", "the file is empty")])
    builder = _Builder(doc, aliases)
    doc.data = builder.build(node, (), set())
    if builder.errors:
        raise SpaceError(builder.errors)
    return doc


class _Builder:
    def __init__(self, doc: Document, aliases: bool = True) -> None:
        self.doc = doc
        self.aliases = aliases
        self.count = 0
        self.errors: list[SourceError] = []
        self.constructor = _Loader("")  # scalar construction, as safe_load does

    def build(self, node: yaml.Node, loc: Loc, active: set[int]) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise SpaceError([SourceError(self.doc.file, node.start_mark.line + 1, key_of(loc),
                                          f"more than {MAX_NODES:,} values"
                                          + (" once its nested aliases are expanded" if
                                             self.aliases else "")
                                          + "; a search space is far smaller")])
        self.doc.lines.setdefault(loc, node.start_mark.line + 1)
        if id(node) in active:
            raise SpaceError([SourceError(self.doc.file, node.start_mark.line + 1, key_of(loc),
                                          "an alias refers to itself")])
        if isinstance(node, yaml.ScalarNode):
            if node.tag not in _SCALARS:
                self.errors.append(SourceError(
                    self.doc.file, node.start_mark.line + 1, key_of(loc),
                    f"the tag {node.tag!r} is not allowed here: a value is a string, a "
                    f"number, true, false or null"))
                return None
            try:
                return self.constructor.construct_object(node, deep=True)
            except yaml.constructor.ConstructorError as e:
                self.errors.append(SourceError(self.doc.file, node.start_mark.line + 1,
                                               key_of(loc), str(e.problem)))
                return None
            except ValueError as e:  # an integer of more than 4,300 digits, say
                self.errors.append(SourceError(self.doc.file, node.start_mark.line + 1,
                                               key_of(loc), f"cannot read {node.value[:30]!r}"
                                               f"...: {e}"))
                return None
        active = active | {id(node)}
        if node.tag not in (_SEQ, _MAP):
            self.errors.append(SourceError(self.doc.file, node.start_mark.line + 1, key_of(loc),
                                           f"the tag {node.tag!r} is not allowed here"))
            return None
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*loc, i), active) for i, item in enumerate(node.value)]
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for knode, vnode in node.value:
                if not isinstance(knode, yaml.ScalarNode):
                    self.errors.append(SourceError(self.doc.file, knode.start_mark.line + 1,
                                                   key_of(loc), "a key must be a plain value"))
                    continue
                if knode.tag == "tag:yaml.org,2002:merge":
                    self.errors.append(SourceError(self.doc.file, knode.start_mark.line + 1,
                                                   key_of(loc), "merge keys (<<) are not "
                                                   "supported; write the keys out"))
                    continue
                try:
                    key = self.constructor.construct_object(knode)
                except (yaml.constructor.ConstructorError, ValueError) as e:
                    self.errors.append(SourceError(self.doc.file, knode.start_mark.line + 1,
                                                   key_of(loc), str(getattr(e, "problem", e))))
                    continue
                if not isinstance(key, str):  # null, true, 1 as keys: YAML allows them
                    self.errors.append(SourceError(
                        self.doc.file, knode.start_mark.line + 1, key_of(loc),
                        f"the key {knode.value!r} is read as {_read_as(key)}: a key is a "
                        "name (quote it to make it one)"))
                    continue
                if key in out:
                    self.errors.append(SourceError(
                        self.doc.file, knode.start_mark.line + 1, key_of((*loc, key)),
                        f"duplicate key (first on line {self.doc.lines[(*loc, key)]})"))
                    continue
                self.doc.lines[(*loc, key)] = knode.start_mark.line + 1
                out[key] = self.build(vnode, (*loc, key), active)
            return out
        raise SpaceError([SourceError(self.doc.file, node.start_mark.line + 1, key_of(loc),
                                      f"unsupported YAML node {type(node).__name__}")])


def _read_as(value: Any) -> str:
    """How YAML read a plain scalar that is not a string: ``null``, ``true``, ``the
    number 1``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return f"the number {value}" if isinstance(value, int | float) else repr(value)


def key_of(loc: Loc) -> str:
    """A key's path as the errors write it: ``objectives[0].metric``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
