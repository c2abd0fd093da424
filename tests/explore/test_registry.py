"""The registry every plugin kind uses, and the documentation of the schema listing
exactly what the registries hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from explore import datasets, families, metrics, optimizers, pruners, samplers
from explore.registry import Registry

ROOT = Path(__file__).resolve().parent.parent.parent


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
