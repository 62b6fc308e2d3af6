"""Prompt-lookup drafts: the latest earlier occurrence of the longest suffix, and their width."""

from tracegym.generation.drafts import MAX_DRAFT, NgramIndex, draft_length


def test_the_longest_suffix_seen_before_gives_what_followed_it():
    index = NgramIndex()
    seq = [1, 2, 3, 4, 9, 2, 3, 5, 7, 1, 2, 3]
    # [1, 2, 3] occurred at the start: 4 and 9 followed it (not the later [2, 3] -> 5)
    assert index.propose(seq, 2) == [4, 9]


def test_the_latest_occurrence_wins_and_shorter_suffixes_are_tried():
    index = NgramIndex()
    seq = [5, 6, 1, 5, 6, 2, 8, 6]
    # no earlier [2, 8, 6] or [8, 6]; the latest earlier [6] was followed by 2, 8, 6
    assert index.propose(seq, 3) == [2, 8, 6]


def test_a_growing_sequence_is_indexed_as_it_grows():
    index = NgramIndex()
    seq = [1, 2, 3]
    assert index.propose(seq, 4) == []  # nothing repeats yet
    seq += [1, 2]
    assert index.propose(seq, 4) == [3, 1, 2]
    seq += [7, 1, 2]
    assert index.propose(seq, 1) == [7]  # [1, 2] was last followed by 7


def test_nothing_is_proposed_without_a_match_or_room():
    index = NgramIndex()
    assert index.propose([1, 2, 3, 4], 5) == []
    assert index.propose([1, 1], 0) == []
    assert index.propose([1], 3) == []


def test_draft_width_shrinks_as_rows_grow():
    assert draft_length(1, 64) == MAX_DRAFT
    assert draft_length(8, 64) == 7
    assert draft_length(24, 64) == 1
    assert draft_length(48, 64) == 0
    assert draft_length(4, 0) == 0
