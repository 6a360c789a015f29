from collections import Counter

import pytest

from packfeed.service.stats import MAX_SKIP_EXAMPLES, WindowStats, format_summary


def test_merge_adds_counts_and_keeps_the_first_examples():
    a = WindowStats(samples_read=10, samples_packed=8, skipped=Counter(malformed_json=2), rows=3, tokens=90, windows=1,
                    skip_examples=[{"sample_id": i} for i in range(4)])
    b = WindowStats(samples_read=5, samples_packed=4, dropped=1, rows=2, tokens=40, windows=1,
                    skip_examples=[{"sample_id": 100 + i} for i in range(4)])
    a.merge(b)
    assert (a.samples_read, a.samples_packed, a.dropped, a.rows, a.tokens, a.windows) == (15, 12, 1, 5, 130, 2)
    assert a.skipped == Counter(malformed_json=2)
    assert [e["sample_id"] for e in a.skip_examples] == [0, 1, 2, 3, 100][:MAX_SKIP_EXAMPLES]
    a.check_accounting()


def test_a_lost_sample_is_an_accounting_error():
    with pytest.raises(RuntimeError, match="read 10 samples but packed 8, skipped 1, dropped 0"):
        WindowStats(samples_read=10, samples_packed=8, skipped=Counter(blank_line=1)).check_accounting()


def test_summary_reports_efficiency_against_the_bound():
    stats = WindowStats(samples_read=3, samples_packed=3, rows=2, tokens=1000).to_dict(seq_len=512, seconds=2.0)
    assert stats["bound_rows"] == 2 and stats["efficiency"] == pytest.approx(1000 / 1024)
    text = format_summary(stats)
    assert "97.66%" in text and "rows (bound)" in text
