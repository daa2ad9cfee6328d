"""``hf-posenc tune``: which training-free method, with which settings, takes *this* model to *that* length best,
and what it costs inside the context it was trained on.

>>> source, texts = ModelSource("Qwen/Qwen2.5-0.5B"), TextSource("emozilla/pg19-test")
>>> report = run_tune(source, texts, TuneConfig(32768), Path("out"))
>>> report = tune(model, tokenizer, ["a document", "another"], target_length=32768)  # a model in memory
>>> report.best  # a MethodSpec
>>> print(report.table())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._startup import lazy_exports

if TYPE_CHECKING:
    from ..reports.tune_report import TuneReport, TuneRow
    from .search import TuneConfig, run_tune, tune
    from .space import Candidate, search_space

__all__ = ["Candidate", "TuneConfig", "TuneReport", "TuneRow", "run_tune", "search_space", "tune"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Candidate": ".space",
        "TuneConfig": ".search",
        "TuneReport": "..reports.tune_report",
        "TuneRow": "..reports.tune_report",
        "run_tune": ".search",
        "search_space": ".space",
        "tune": ".search",
    },
)
