"""``hf-posenc tune``: which training-free method, with which settings, takes *this* model to *that* length best,
and what it costs inside the context it was trained on.

>>> report = tune(ModelSource("Qwen/Qwen2.5-0.5B"), TextSource("emozilla/pg19-test"), TuneConfig(32768), Path("out"))
>>> report.best  # a MethodSpec
>>> print(report.table())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._startup import lazy_exports

if TYPE_CHECKING:
    from ..reports.tuning import TuneReport, TuneRow
    from .search import TuneConfig, tune
    from .space import Candidate, search_space

__all__ = ["Candidate", "TuneConfig", "TuneReport", "TuneRow", "search_space", "tune"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Candidate": ".space",
        "TuneConfig": ".search",
        "TuneReport": "..reports.tuning",
        "TuneRow": "..reports.tuning",
        "search_space": ".space",
        "tune": ".search",
    },
)
