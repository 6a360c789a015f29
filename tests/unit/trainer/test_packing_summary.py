"""The packing line of ``packfeed train``'s summary: a packed directory's figures say they came
from the packed output; figures nobody counted leave the line out, never a false 0 (a packed
directory's run said ``packing efficiency 0.0% (0 rows packed)``: its reader packs no window)."""

import pytest

from packfeed.trainer.loop.interval import PACKED_OUTPUT, READER, format_summary, packing_figures

SUMMARY = {"steps": 3, "first_loss": 2.0, "last_loss": 1.0, "wall_seconds": 4.0, "final_model": "runs/x/final"}
PACKED_STATS = {"rows": 873, "tokens": 439_650, "efficiency": 0.9834, "samples_packed": 7_500, "windows": 15,
                "seconds": 0.8, "sources": []}


def packing_line(summary: dict) -> str | None:
    return next((line for line in format_summary(summary).splitlines() if line.startswith("packing")), None)


@pytest.mark.parametrize("packing", [
    pytest.param({"rows": None, "tokens": None, "efficiency": None, "samples_packed": None, "windows": None},
                 id="a-packed-directorys-reader-packed-nothing"),
    pytest.param({"rows": 0, "tokens": 0, "efficiency": 0.0, "samples_packed": 0, "windows": 0},
                 id="a-finished-run-resumed"),
    pytest.param(None, id="none"),
])
def test_figures_nobody_counted_leave_the_line_out(packing):
    assert packing_line({**SUMMARY, "packing": packing}) is None
    assert packing_figures(packing, origin=READER) is None


def test_a_packed_directorys_figures_say_where_they_came_from():
    packing = packing_figures(PACKED_STATS, origin=PACKED_OUTPUT)
    assert packing == {"rows": 873, "tokens": 439_650, "efficiency": 0.9834, "samples_packed": 7_500, "windows": 15,
                       "from": PACKED_OUTPUT}
    assert packing_line({**SUMMARY, "packing": packing}).split(None, 2)[2] == \
        "98.3% (873 rows packed, from the packed output's stats.json)"


def test_the_readers_own_figures():
    packing = packing_figures({**PACKED_STATS, "rows": 12}, origin=READER)
    assert packing_line({**SUMMARY, "packing": packing}).split(None, 2)[2] == "98.3% (12 rows packed)"
