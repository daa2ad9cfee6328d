"""The winner of a tune of a GGUF model: a config-only folder that names the GGUF file as well as its folder, loaded
by ``hf_posenc.from_pretrained`` to the numbers of the GGUF model patched with the winner; ``push`` refuses to make
a card name a file as its base (the real offline model)."""

from __future__ import annotations

import json

import pytest
import torch

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.eval import ModelSource
from hf_posenc.reports.tune_report import TuneReport, TuneRow
from hf_posenc.tuning.winner import save_winner

pytestmark = pytest.mark.xdist_group("smollm2")


def _report(method: str) -> TuneReport:
    row = TuneRow(method, "yarn", 20.0, 3.0, 0.01, 0.0, 0.0, {8192: 1.01}, {8192: 0.001}, True, rank=1)
    return TuneReport("smollm2", "essays", 8192, 16384, [8192], 0.03, {8192: 22.19}, (row,))


def test_a_gguf_models_winner_loads_where_its_file_is(smollm2, tmp_path, capsys):
    model, _ = smollm2
    source = ModelSource.named(None)
    best = save_winner(source, _report("yarn:factor=2.0"), tmp_path / "best")
    assert best is not None and best.text == "yarn:factor=2.0"
    metadata = json.loads((tmp_path / "best" / "hf_posenc.json").read_text())
    assert (metadata["base_model"], metadata["base_gguf_file"]) == (source.name, source.gguf_file)
    assert metadata["base_revision"] is None and metadata["weights"] is False
    assert source.gguf_file in (tmp_path / "best" / "README.md").read_text()

    loaded = hf_posenc.from_pretrained(str(tmp_path / "best"), dtype=torch.float32).eval()
    assert hf_posenc.get_patch(loaded).method == "yarn"
    ids = torch.arange(100, 300).unsqueeze(0)
    with torch.no_grad(), hf_posenc.patched(model, best):
        expected = model(ids).logits
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected)

    assert main(["push", "--model", str(tmp_path / "best"), "--method", "yarn:factor=2", "--repo", "me/x"]) == 2
    error = capsys.readouterr().err
    assert f"takes its weights from the GGUF file {source.gguf_file}" in error and "Traceback" not in error
