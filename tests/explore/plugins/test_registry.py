"""The registry every plugin kind uses, and the documentation of the schema listing
exactly what the registries hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from explore import datasets, families, metrics, optimizers, pruners, samplers
from explore.registry import Registry

ROOT = Path(__file__).resolve().parents[3]


class Thing:
    pass


def test_register_get_and_the_error_that_lists_what_is_available() -> None:
    things: Registry[Thing] = Registry("thing", error=KeyError)

    @things.register("a")
    class A(Thing):
        pass

    assert isinstance(things.get("a"), A) and "a" in things and things.names() == ("a",)
    with pytest.raises(KeyError, match="unknown thing 'b'; available: a"):
        things.get("b")
    with pytest.raises(ValueError, match="already registered"):
        things.register("a")(A)
    with pytest.raises(ValueError, match=r"Input should be 'a'$"):
        things.check("b")
    things.unregister("a")
    assert things.names() == ()


def test_check_words_its_error_as_a_literal_did() -> None:
    r: Registry[Thing] = Registry("thing")
    for n in ("x", "y", "z"):
        r.register(n)(Thing)
    with pytest.raises(ValueError, match=r"^Input should be 'x', 'y' or 'z'$"):
        r.check(3)
    assert r.check("y") == "y"


@pytest.mark.parametrize("module", [datasets, families, metrics, optimizers, pruners, samplers])
def test_the_schema_documentation_names_every_registered_implementation(module: object
                                                                         ) -> None:
    doc = (ROOT / "search_spaces" / "README.md").read_text()
    for name in module.names():  # type: ignore[attr-defined]
        assert name in doc, f"search_spaces/README.md does not mention {name!r}"


def test_a_module_dropped_into_a_plugin_package_registers_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding an implementation touches one new module: the package finds it."""
    import sys

    from explore.registry import import_plugins

    pkg = tmp_path / "plugdemo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_base.py").write_text("from explore.registry import Registry\n"
                                  "THINGS = Registry('thing')\n")
    for name in ("_b", "_a"):
        (pkg / f"{name}.py").write_text(
            "from plugdemo._base import THINGS\n"
            f"@THINGS.register({name[1:]!r})\nclass Impl:\n    pass\n")
    (pkg / "helpers.py").write_text("raise AssertionError('public modules are not plugins')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import plugdemo

        assert import_plugins("plugdemo", plugdemo.__path__) == ["plugdemo._a", "plugdemo._b"]
        from plugdemo._base import THINGS

        assert THINGS.names() == ("a", "b")
        assert import_plugins("plugdemo", plugdemo.__path__) == []  # once only
    finally:
        for m in [m for m in sys.modules if m == "plugdemo" or m.startswith("plugdemo.")]:
            del sys.modules[m]
