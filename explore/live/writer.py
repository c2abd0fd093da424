"""The driver's writer: the study's writes in order, on a thread of its own (or inline,
for a simulation), with the driver's heartbeat between them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from optuna.exceptions import UpdateFinishedTrialError

from explore.live.names import HEARTBEAT_PREFIX
from explore.live.timing import _on_writer
from explore.storages import explain

if TYPE_CHECKING:
    from explore.live.study import LiveStudy
    from explore.storages.files import StorageFile

def _failed(e: BaseException, file: StorageFile | None = None) -> str:
    """What a failed storage call means (Optuna's own message hides the cause); where
    the study's ``file`` was deleted or replaced under the run, that, which the call's
    own error (a lock file or a table not found) follows from."""
    lost = file.lost() if file is not None else None
    return lost or explain(e)


class _Writer:
    """Writes to the storage on a thread of its own, in order, and records the
    driver's heartbeat every :data:`HEARTBEAT_EVERY` seconds.  After a failed write
    it writes nothing more (the rest would fail the same way) and keeps the reason.
    ``inline``: no thread; each write is done when it is put, and the heartbeat when
    one is due at a write or a :meth:`tick` (a simulation's drivers)."""

    def __init__(self, live: LiveStudy, inline: bool = False) -> None:
        self.live = live
        self.queue: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self.error: str | None = None
        # Writes dropped because another driver ended their trial meanwhile: it found
        # this one silent past the grace (stalled, suspended), failed the trial as stale
        # and queued its repeat, so this driver's result of it would count it twice.
        self.taken_over = 0
        self.beat = 0.0
        self.inline, self.closed = inline, False
        self.thread = threading.Thread(target=self._run, name="explore-study-writer",
                                       daemon=True)
        if not inline:
            self.thread.start()

    def put(self, write: Callable[[], Any]) -> None:
        if self.inline:
            if not self.closed:
                self._inline(write)
        else:
            self.queue.put(write)

    def tick(self) -> None:
        """(inline) The heartbeat, if one is due: what the thread does when idle."""
        if self.inline and not self.closed:
            self._inline(_idle)

    def running(self) -> bool:
        """Whether writes put now are still done."""
        return not self.closed if self.inline else self.thread.is_alive()

    def _inline(self, item: Callable[[], Any]) -> None:
        if self.error is not None:
            return
        was = getattr(_on_writer, "yes", False)
        _on_writer.yes = True  # counted as the writer's calls, as on its thread
        try:
            self._heartbeat()
            item()
        except UpdateFinishedTrialError:
            self.taken_over += 1
        except Exception as e:  # raised by the next check, as the thread's are
            self.error = _failed(e, self.live.file)
        finally:
            _on_writer.yes = was

    def _heartbeat(self) -> None:
        now = self.live.clock()
        if now - self.beat >= self.live.every:
            self.beat = now
            live = self.live
            live.storage.set_study_system_attr(live.study_id, HEARTBEAT_PREFIX + live.driver,
                                               now)

    def _run(self) -> None:
        _on_writer.yes = True  # this thread's storage calls are the writer's
        while True:
            try:
                item = self.queue.get(timeout=self.live.every / 2)
            except queue.Empty:
                item = _idle
            if item is None:
                return
            if self.error is not None:
                if isinstance(item, _Marker):
                    item()
                continue
            try:
                self._heartbeat()
                item()
            except UpdateFinishedTrialError:
                self.taken_over += 1
            except Exception as e:  # re-raised on the scheduler's thread
                self.error = _failed(e, self.live.file)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every write put so far is done (or failed)."""
        if self.inline:
            return  # done as they were put
        done = threading.Event()
        self.queue.put(_Marker(done))
        if self.thread.is_alive():
            done.wait(timeout)

    def close(self) -> None:
        if self.inline:
            self.closed = True
        elif self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()


class _Marker:
    """A point in the queue that a flush waits for (reached even after a failure)."""

    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def __call__(self) -> None:
        self.done.set()


def _idle() -> None:
    """A wake-up with nothing to write: the heartbeat is due."""
