"""A storage is one module: a throwaway one, registered here under a URL scheme, holds
a study opened with such a URL."""

from __future__ import annotations

from collections.abc import Iterator

import optuna
import pytest

from explore import storages
from explore.space import parse_space
from explore.storages import BaseStorage, open_storage
from explore.study import open_study

SHARED = optuna.storages.InMemoryStorage()


class Shared(BaseStorage):
    """``shared://``: one in-memory storage for the whole process."""

    def create(self, url: str) -> optuna.storages.BaseStorage | str:
        return SHARED


@pytest.fixture
def shared() -> Iterator[None]:
    storages.register("shared")(Shared)
    yield
    storages.STORAGES.unregister("shared")


def test_a_registered_storage_opens_its_urls(shared: None) -> None:
    space = parse_space({"name": "s", "dataset": "digits",
                         "budget": {"trials": 1, "rounds": 1, "memory": "64MB"}})
    study = open_study(space, "shared://anything")
    study.tell(study.ask(), 0.5)
    again = open_study(space, "shared://anything")  # resumes: same storage, same name
    assert [t.value for t in again.trials] == [0.5]


def test_sqlite_gets_write_ahead_logging_and_other_schemes_go_to_optuna(tmp_path: object
                                                                       ) -> None:
    s = open_storage(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(s, optuna.storages.RDBStorage)
    with s.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    assert open_storage("postgresql://host/db") == "postgresql://host/db"
