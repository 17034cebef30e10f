"""A call that runs out of time while retrying says why it retried."""

from __future__ import annotations

import time

from kvstored.client._ops import final_error
from kvstored.errors import DeadlineExceeded, Draining, InvalidArgument


def test_deadline_passed_while_retrying_raises_the_retried_error() -> None:
    # regression: a put to a draining node raised "deadline passed before calling Put" when
    # the last backoff slept up to the deadline, Draining otherwise
    draining = Draining("node is draining")
    late = DeadlineExceeded("deadline passed before calling Put")
    assert final_error(late, draining, time.monotonic() - 0.001) is draining


def test_other_endings_keep_their_own_error() -> None:
    draining = Draining("node is draining")
    late = DeadlineExceeded("deadline passed before calling Put")
    assert final_error(late, None, time.monotonic() - 1) is late  # nothing was retried
    assert final_error(late, draining, time.monotonic() + 60) is late  # time is left
    bad = InvalidArgument("bad key")
    assert final_error(bad, draining, time.monotonic() - 1) is bad
