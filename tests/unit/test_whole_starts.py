"""Where a pipeline's first batch starts when a source transaction lies across the starts (pure logic)."""

from __future__ import annotations

from pipelines.transactions.starts import pulled_back

P, Q, R = ("t", 0), ("t", 1), ("u", 0)
STARTS = {P: 10, Q: 100, R: 50}


def test_a_transaction_across_the_starts_moves_them_back_to_its_first_event() -> None:
    # T: events at/after P's start (seen above) and at 95 and 97 in Q, below Q's start.
    assert pulled_back(STARTS, {"T"}, [("T", Q, 97), ("T", Q, 95)]) == {P: 10, Q: 95, R: 50}


def test_what_a_moved_start_takes_in_must_be_whole_too() -> None:
    # Moving Q back to 95 takes in U's event at 97; U also has an event at 40 in R, so R moves
    # to 40, which takes in V at 45, whose other event is at 90 in Q: Q moves on to 90.
    below = [("T", Q, 95), ("U", Q, 97), ("U", R, 40), ("V", R, 45), ("V", Q, 90), ("W", Q, 20)]
    assert pulled_back(STARTS, {"T"}, below) == {P: 10, Q: 90, R: 40}  # W, wholly before, stays out


def test_transactions_on_one_side_only_move_nothing() -> None:
    assert pulled_back(STARTS, {"X"}, [("Y", Q, 95), ("Z", R, 49)]) == STARTS
    assert pulled_back(STARTS, set(), [("Y", Q, 95)]) == STARTS
    assert pulled_back(STARTS, {"Y"}, []) == STARTS
