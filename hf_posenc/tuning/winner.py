"""The winner of a tune saved as a config-only folder: the base model's config patched with the winning method, the
tokenizer, ``hf_posenc.json`` naming the base whose weights it loads, and a card quoting the tune's table.

:func:`hf_posenc.from_pretrained` loads it (the base's weights, the patched config); ``hf-posenc push --model`` on it
shares it. No weights are read or written: the config is patched on a model built on the meta device. A GGUF
model's folder names its file too (``base_gguf_file``): it loads where that file is, and is shared by pushing the
loaded model with its weights.
"""

from __future__ import annotations

import copy
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from .._version import __version__
from ..eval.models import EvalModel, load_tokenizer, read_base_config
from ..files import atomic_write_text, json_text
from ..hub.markdown import markdown_code, markdown_text
from ..hub.metadata import METADATA_FILE, METADATA_FORMAT
from ..patching import patch
from ..registry import get_method
from ..reports.tune_report import TuneReport
from ..spec import MethodSpec, format_method_spec

logger = logging.getLogger("hf_posenc")

WINNER_FOLDER = "best"


def save_winner(
    model_source: EvalModel, report: TuneReport, folder: Path, *, commit: str | None = None
) -> MethodSpec | None:
    """Write the config-only folder of ``report``'s winner into ``folder``, and return the method written; None,
    and no folder (one of an earlier tune removed), where no candidate won or the base model's weights cannot be
    named (a model in memory without a name: patch it with ``report.best`` and ``save_pretrained`` it). A GGUF
    model's folder names its file too (``base_gguf_file``).

    Args:
        model_source (`ModelSource` or `LoadedModel`): the model tuned (a saved patch's base is what the winner
            patches).
        report (`TuneReport`): the tune's report.
        folder (`Path`): the folder to write (made; files in it replaced).
        commit (`str`, *optional*): the commit of the base model the tune loaded, recorded as the weights'.
    """
    if folder.is_dir():
        shutil.rmtree(folder)
    unnamed = _unnamed_weights(model_source)
    if report.best is None or unnamed:
        if report.best is not None:
            logger.warning(
                "The winner is not saved as a config-only folder: %s. Patch a loaded model with %r and save it "
                "(save_pretrained).",
                unnamed,
                report.best.text,
            )
        return None
    best = serving_spec(report.best, report.target_length)
    saved = model_source.saved_patch()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(copy.deepcopy(read_base_config(model_source)))
    patch(model, best)
    folder.mkdir(parents=True)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    load_tokenizer(model_source, saved).save_pretrained(folder)
    if saved is not None and saved.weights_from:
        base, revision, gguf = saved.weights_from, saved.weights_revision, saved.weights_gguf_file
    else:
        base, revision, gguf = model_source.name, commit or model_source.revision, model_source.gguf_file
    metadata = {"format": METADATA_FORMAT, "weights": False, "base_model": base, "base_revision": revision}
    metadata |= {"base_gguf_file": gguf} if gguf else {}
    metadata["hf_posenc_version"] = __version__
    atomic_write_text(folder / METADATA_FILE, json_text(metadata))
    atomic_write_text(folder / "README.md", winner_card(report, best, metadata))
    return best


def _unnamed_weights(model_source: EvalModel) -> str | None:
    """Why a config-only folder cannot name the weights of ``model_source``, or None where it can."""
    if not model_source.name:
        return "its model was built in memory, and no name loads its weights"
    folder = Path(model_source.name)
    if not model_source.gguf_file and folder.is_dir() and not (folder / "config.json").is_file():
        return f"the folder {model_source.name} holds no config.json that loads its weights (a GGUF file?)"
    return None


def serving_spec(spec: MethodSpec, target: int) -> MethodSpec:
    """``spec`` with ``max_position_embeddings`` the target where the method takes one and ``spec`` leaves it to the
    default (DCA and ReRoPE keep the config's ``L``): what vLLM and lm-evaluation-harness read as the model's
    length. The numbers do not change."""
    if "max_position_embeddings" not in get_method(spec.method).param_names or "max_position_embeddings" in spec.params:
        return spec
    return MethodSpec.parse(format_method_spec(spec.name, {**spec.params, "max_position_embeddings": target}))


def winner_card(report: TuneReport, best: MethodSpec, metadata: dict[str, Any]) -> str:
    """The folder's model card: what the method is, where the weights come from, and the tune's table."""
    tied = report.tied_with_best
    within = f" (tied within noise: {', '.join(markdown_code(m) for m in tied)})" if tied else ""
    gguf = f" (its GGUF file {markdown_code(metadata['base_gguf_file'])})" if "base_gguf_file" in metadata else ""
    return "\n".join(
        [
            "---",
            "library_name: transformers",
            "tags:",
            "- hf_posenc",
            "---",
            "",
            f"# {markdown_text(report.model)} with {markdown_code(best.text)}",
            "",
            f"The training-free extension that `hf-posenc tune` ranked first{within} for taking "
            f"{markdown_code(report.model)} from its trained context of {report.trained_context} tokens to "
            f"{report.target_length}, on {markdown_code(report.dataset)}, among the candidates whose perplexity inside "
            f"the trained context stays within {report.max_regression:.0%} of the unpatched model's.",
            "",
            f"This folder holds no weights: they load from {markdown_code(metadata['base_model'])}{gguf}.",
            "",
            "```python",
            "import hf_posenc",
            "",
            'model = hf_posenc.from_pretrained("PATH_OR_REPO")',
            "```",
            "",
            "```text",
            report.table(),
            "```",
            "",
        ]
    )
