"""How many trials each ask of the scheduler draws (:func:`explore.scheduler.intake.draws`):
the decision the loop makes before every ask, tested without processes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from explore.scheduler.intake import draws

stacks, counts, workers = st.integers(1, 64), st.integers(0, 10_000), st.integers(1, 256)


@given(stacks, counts, workers, st.integers(0, 1_000))
def test_an_ask_draws_at_least_one_and_at_most_a_stack(stack: int, unclaimed: int,
                                                         n: int, asked: int) -> None:
    k = draws(stack, unclaimed, n, asked)
    assert 1 <= k <= stack
    if unclaimed:  # the last stacks are shared out among the workers
        assert k <= -(-unclaimed // n)


@given(stacks, counts, workers)
def test_each_workers_first_ask_is_one_trial_where_the_study_is_more_than_a_wave(
        stack: int, unclaimed: int, n: int) -> None:
    firsts = [draws(stack, unclaimed, n, asked) for asked in range(n)]
    if unclaimed > stack * n:
        assert firsts == [1] * n
        # and stacks from then on
        assert draws(stack, unclaimed, n, n) == stack
    else:  # one wave: stacked from the first ask
        assert firsts == [max(1, min(stack, -(-unclaimed // n)))] * n


def test_the_paper_space_s_first_asks() -> None:
    # 60 trials, stacks of 8, two workers: one trial each, then stacks of 8, and the
    # last trials split between the workers
    assert [draws(8, 60 - a, 2, a) for a in range(2)] == [1, 1]
    assert draws(8, 58, 2, 2) == 8
    assert draws(8, 9, 2, 9) == 5 and draws(8, 3, 2, 10) == 2
