"""Run under transformers 4.x (``PYTHONPATH`` = a ``pip install --target`` of it), without hf_posenc: load each saved
model folder with plain ``AutoModelForCausalLM`` and write its logits on the given ids, or the error it raised.

Usage: ``python legacy_reader.py REQUEST.json RESULT.json``; REQUEST: ``{"folders": [...], "ids": [[...]]}``.
"""

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def read(folder: str, ids: torch.Tensor) -> dict:
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    except Exception as error:  # what a user of 4.x sees: the test checks it is a refusal, not a model
        return {"refused": f"{type(error).__name__}: {error}"}
    config = AutoConfig.from_pretrained(folder)
    with torch.no_grad():
        logits = model(ids).logits
        rotary = getattr(model.base_model, "rotary_emb", None)  # GPT-2 has none
        positions = torch.arange(ids.shape[1])[None]
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions) if rotary is not None else ([], [])
    rope = {"cos": cos.tolist(), "sin": sin.tolist()} if rotary is not None else {}
    return {"logits": logits.tolist(), "rope_theta": getattr(config, "rope_theta", None), **rope}


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    ids = torch.tensor(request["ids"])
    results = {folder: read(folder, ids) for folder in request["folders"]}
    Path(sys.argv[2]).write_text(json.dumps({"transformers": transformers.__version__, "results": results}))


if __name__ == "__main__":
    main()
