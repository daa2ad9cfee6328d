"""Helpers shared by test modules in several folders: model snapshots, generation, reference formulas."""

from __future__ import annotations

import atexit
import json
import math
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

import hf_posenc
from hf_posenc.spec import parse_method_spec


def gpu(test):
    """``@pytest.mark.gpu``, skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))


def paper_slopes(n: int) -> list[float]:
    """The paper's reference code (github.com/ofirpress/attention_with_linear_biases), transcribed."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


def generate(model, prompt, mask=None, new=40, **kwargs):
    """Greedy generation of ``new`` tokens (``kwargs``: more of generate's, e.g. cache_implementation)."""
    model.generation_config.eos_token_id = None
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt) if mask is None else mask,
        max_new_tokens=new,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    return out.sequences, torch.stack(out.logits, dim=1)  # (B, P+new), (B, new, V)


def assert_left_padded_batch_generates_as_each_alone(model, long: torch.Tensor, short: torch.Tensor) -> None:
    """``long`` and ``short`` (1, n) prompts generated as one left-padded batch give each one's own tokens and
    logits (1e-4)."""
    pad = long.shape[1] - short.shape[1]
    batch = torch.cat([long, torch.cat([torch.zeros(1, pad, dtype=torch.long), short], 1)])
    mask = (torch.arange(long.shape[1]) >= torch.tensor([[0], [pad]])).long()
    sequences, logits = generate(model, batch, mask)
    for row, alone in enumerate([long, short]):
        alone_sequence, alone_logits = generate(model, alone)
        assert torch.equal(sequences[row, -40:], alone_sequence[0, -40:])
        torch.testing.assert_close(logits[row], alone_logits[0], rtol=1e-4, atol=1e-4)


def method_params(method: str, pairs: int) -> dict:
    return {
        "alibi": {},
        "dca": {},
        "dynamic-yarn": {},
        "logn": {},
        "nope": {},
        "self-extend": {},
        "string": {"local_value": 4},
        "rerope": {},
        "leaky-rerope": {},
        "sinusoidal": {},
        "t5-bias": {"num_buckets": 8, "max_distance": 16},
        "longrope": {"factor": 4, "long_factor": [1.0 + i / 4 for i in range(pairs)]},
    }.get(method, {"factor": 4})


def snapshot(model) -> dict:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "buffers": {k: v.clone() for k, v in model.named_buffers()},
        "config": model.config.to_dict(),
        "classes": [type(m) for m in model.modules()],
        "instance_attrs": [sorted(m.__dict__) for m in model.modules()],
    }


def assert_refused(model, method: str, params: dict, error: type[Exception], match: str) -> None:
    """``patch`` raises ``error`` matching ``match`` and leaves ``model`` exactly as it was, unpatched."""
    before = snapshot(model)
    with pytest.raises(error, match=match):
        hf_posenc.patch(model, method, **params)
    assert hf_posenc.get_patch(model) is None
    assert_same(before, snapshot(model))


def assert_same(before: dict, after: dict) -> None:
    assert before["state"].keys() == after["state"].keys()
    for key in before["state"]:
        assert torch.equal(before["state"][key], after["state"][key]), key
    assert before["buffers"].keys() == after["buffers"].keys()
    for key in before["buffers"]:
        assert before["buffers"][key].dtype == after["buffers"][key].dtype, key
        assert torch.equal(before["buffers"][key], after["buffers"][key]), key
    assert before["config"] == after["config"]
    assert before["classes"] == after["classes"]
    assert before["instance_attrs"] == after["instance_attrs"]


_PLAIN_LOADER = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(1)
    for line in sys.stdin:
        request, out = json.loads(line), {}
        ids = torch.load(request["ids"])
        for folder in request["folders"]:
            try:
                model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
                with torch.no_grad():
                    torch.save(model(ids).logits, folder + "/plain_logits.pt")
                out[folder] = "loaded"
            except Exception as error:
                out[folder] = f"{type(error).__name__}: {error}"
        assert "hf_posenc" not in sys.modules
        print("PLAIN " + json.dumps(out), flush=True)
    """
)
_plain_loader: list[subprocess.Popen] = []  # one interpreter per test process, started at the first call


def plain_load(ids_file: Path | str, *folders: Path | str) -> dict[str, str]:
    """Each folder loaded by plain transformers, in an interpreter that never imports hf_posenc (kept for the test
    process: one import of torch and transformers for every call): folder -> ``"loaded"`` (its logits of the ids
    saved in ``ids_file`` written to ``plain_logits.pt`` in the folder) or the error it raised."""
    if not _plain_loader or _plain_loader[0].poll() is not None:
        command = [sys.executable, "-c", _PLAIN_LOADER]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        atexit.register(process.kill)
        _plain_loader[:] = [process]
    process = _plain_loader[0]
    process.stdin.write(json.dumps({"ids": str(ids_file), "folders": [str(f) for f in folders]}) + "\n")
    process.stdin.flush()
    for line in process.stdout:
        if line.startswith("PLAIN "):
            return json.loads(line.removeprefix("PLAIN "))
    raise RuntimeError("The plain transformers interpreter exited (its error is in the test's output).")


YARN_PPL = {512: 25.81, 1024: 27.72, 4096: 26.63}


BASE_PPL = {512: 23.9, 1024: 25.7, 2048: 25.1}


def write_results(
    folder, rows, *, model: str = "org/tiny-base", params: dict | None = None, dataset: str = "pg19", **details
):
    """An eval results.json as the eval engineer writes it; ``params``: the resolved parameters of every
    non-``none`` row (default: its spec's, resolved on the tiny Llama: :func:`resolved_params`); ``details``: more
    top-level fields (``dataset_details``, ``model_details``...)."""
    data = {
        "protocol": "sliding-window",
        "model": model,
        "dataset": dataset,
        "versions": {"hf_posenc": "0.1.0"},
        **details,
        "dataset_details": {"documents": 1, "tokens": 10, **details.get("dataset_details", {})},
        "results": [
            {
                "method": method,
                "params": {} if method == "none" else resolved_params(method) if params is None else params,
                "length": length,
                "ppl": ppl,
                "nll": 1.0,
                "tokens": 10,
                "windows": 1,
            }
            for method, table in rows.items()
            for length, ppl in table.items()
        ],
    }
    path = folder / "results.json"
    path.write_text(json.dumps(data))
    return path


def resolved_params(spec: str) -> dict:
    """``spec``'s parameters as a patch of the tiny Llama (trained context 64) resolves them, as eval records them."""
    from tiny_models import make_tiny

    name, params = parse_method_spec(spec)
    return dict(hf_posenc.get_patch(hf_posenc.patch(make_tiny("llama"), name, **params)).params)


SPECS = {  # every registered method as a spec, on the tiny Llama (8 frequency pairs) or GPT-2 (FAMILY_OF)
    "alibi": "alibi",
    "dca": "dca:chunk_size=48,local_size=4",
    "dynamic-ntk": "dynamic-ntk:factor=2",
    "dynamic-yarn": "dynamic-yarn",
    "llama3": "llama3:factor=2",
    "logn": "logn",
    "longrope": "longrope:factor=2,long_factor=[1,1,1.5,1.5,2,2,2,2],short_factor=[1,1,1,1,1,1,1,1]",
    "ntk": "ntk:factor=2",
    "nope": "nope",
    "ntk-by-parts": "ntk-by-parts:factor=2",
    "pi": "pi:factor=2",
    "self-extend": "self-extend:group_size=4,window=16",
    "string": "string:shifted_offset=20,local_value=4",
    "rerope": "rerope:window=8",
    "leaky-rerope": "leaky-rerope:window=8,k=2",
    "sinusoidal": "sinusoidal",
    "t5-bias": "t5-bias:num_buckets=8,max_distance=16",
    "yarn": "yarn:factor=2",
}
FAMILY_OF = {"sinusoidal": "gpt2"}  # methods that patch learned positions only: SPECS on the tiny GPT-2


def family_of(method: str) -> str:
    """The tiny family a method of SPECS is tried on."""
    return FAMILY_OF.get(method, "llama")


def pip_target(requirement: str, *, no_deps: bool = False) -> Path:
    """``pip install --target`` of ``requirement`` (``transformers==4.57.6``) into ``.cache/`` of the repository, once:
    another transformers beside the venv's, put first on ``PYTHONPATH`` in a subprocess. Installed to a temporary
    folder of this process first and renamed into place, so an interrupted install is never used and two pytest
    workers installing at once each keep a whole one (the second rename loses, and its copy is removed)."""
    target = Path(__file__).resolve().parents[1] / ".cache" / requirement.replace("==", "-")
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=target.name + ".partial-", dir=target.parent))
    command = [sys.executable, "-m", "pip", "install", "-q", "--target", str(partial), requirement]
    done = subprocess.run(command + (["--no-deps"] if no_deps else []), capture_output=True, text=True)
    if done.returncode:
        shutil.rmtree(partial, ignore_errors=True)
        pytest.fail(f"pip could not install {requirement} into {partial}:\n{done.stderr[-2000:]}")
    try:
        partial.rename(target)
    except OSError:  # another worker's install is in place
        shutil.rmtree(partial, ignore_errors=True)
    return target
