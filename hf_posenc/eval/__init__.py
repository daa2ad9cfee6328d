"""Long-context evaluation: perplexity against length, passkey retrieval and lm-evaluation-harness tasks, with
accelerate.

>>> source = ModelSource("Qwen/Qwen2.5-0.5B")
>>> texts = TextSource("emozilla/pg19-test", max_documents=20)
>>> config = PerplexityConfig(lengths=[4096, 16384], methods=["none", "yarn:factor=4"])
>>> report = run_perplexity(source, texts, config, Path("out"))  # results.json, results.csv, the plot
>>> report.ppl("yarn:factor=4", 16384)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._startup import lazy_exports

if TYPE_CHECKING:
    from ..reports.runs import PasskeyReport, PerplexityReport
    from ..reports.tasks import LmEvalReport
    from .data import TextSource
    from .harness import LmEvalConfig, run_lm_eval
    from .models import LoadedModel, ModelSource
    from .runner import PasskeyConfig, PerplexityConfig, run_passkey, run_perplexity

__all__ = [
    "LmEvalConfig",
    "LoadedModel",
    "LmEvalReport",
    "ModelSource",
    "PasskeyConfig",
    "PasskeyReport",
    "PerplexityConfig",
    "PerplexityReport",
    "TextSource",
    "run_lm_eval",
    "run_passkey",
    "run_perplexity",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "LmEvalConfig": ".harness",
        "LmEvalReport": "..reports.tasks",
        "TextSource": ".data",
        "run_lm_eval": ".harness",
        "LoadedModel": ".models",
        "ModelSource": ".models",
        "PasskeyConfig": ".runner",
        "PasskeyReport": "..reports.runs",
        "PerplexityConfig": ".runner",
        "PerplexityReport": "..reports.runs",
        "run_passkey": ".runner",
        "run_perplexity": ".runner",
    },
)
