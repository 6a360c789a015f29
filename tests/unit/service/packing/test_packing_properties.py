"""Property tests of pack(): for any lengths, seq_len, strategy and overlong policy the packing
is valid (check_packing), bfd is exactly best-fit decreasing, and exactfit is never worse
than bfd nor better than the lower bound. Deterministic
(derandomize) and small, so the whole file runs in a few seconds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from packfeed.service.packing import OVERLONG_POLICIES, STRATEGIES, check_packing, pack
from packfeed.service.packing.bounds import lower_bound
from packfeed.service.packing.check import reference_bfd_fills

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True)

lengths_st = st.lists(st.integers(1, 100), min_size=0, max_size=60)


@SETTINGS
@given(
    lengths=lengths_st,
    seq_len=st.integers(1, 64),
    strategy=st.sampled_from(sorted(STRATEGIES)),
    overlong=st.sampled_from(OVERLONG_POLICIES),
)
def test_any_input_gives_a_valid_packing(lengths, seq_len, strategy, overlong):
    p = pack(lengths, seq_len, strategy=strategy, overlong=overlong)
    check_packing(p, lengths, seq_len, strategy=strategy, overlong=overlong)
    if strategy == "concat":
        assert p.num_rows == -(-p.num_tokens // seq_len)


@SETTINGS
@given(lengths=lengths_st, seq_len=st.integers(1, 64), overlong=st.sampled_from(OVERLONG_POLICIES))
def test_bfd_is_exact_best_fit_decreasing(lengths, seq_len, overlong):
    p = pack(lengths, seq_len, strategy="bfd", overlong=overlong)
    # The items BFD packs: whole samples, truncated to seq_len, or split into seq_len pieces.
    items = []
    for n in lengths:
        if n <= seq_len:
            items.append(n)
        elif overlong == "truncate":
            items.append(seq_len)
        elif overlong == "split":
            items += [seq_len] * (n // seq_len) + ([n % seq_len] if n % seq_len else [])
    assert sorted(p.row_tokens().tolist()) == reference_bfd_fills(items, seq_len)
    assert p.num_rows >= -(-sum(items) // seq_len)


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=80),
    seq_len=st.integers(8, 64),
)
def test_bfd_never_worse_than_one_row_per_half(lengths, seq_len):
    # BFD leaves at most one row at most half full (any two such rows would have been merged).
    p = pack(lengths, seq_len, strategy="bfd")
    assert int((2 * p.row_tokens() <= seq_len).sum()) <= 1


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=80),
    seq_len=st.integers(8, 64),
    overlong=st.sampled_from(OVERLONG_POLICIES),
)
def test_exactfit_between_the_bound_and_bfd(lengths, seq_len, overlong):
    p = pack(lengths, seq_len, overlong=overlong)  # the default strategy: exactfit
    plain = pack(lengths, seq_len, strategy="bfd", overlong=overlong)
    assert p.num_rows <= plain.num_rows
    kept = p.segment_len  # the items packed, whatever the policy did
    assert p.num_rows >= lower_bound(kept, seq_len)
