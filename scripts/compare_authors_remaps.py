"""hf_posenc's ReRoPE, Leaky ReRoPE and STRING against the authors' published code: the logits of one tiny Llama.

* ReRoPE and Leaky ReRoPE (Su 2023, kexue.fm/archives/9708): bojone/rerope ``rerope_patch.py`` and
  ``leaky_rerope_patch.py``, tested there with transformers 4.31.0. Both multiply each query by Qwen's log-n
  factor ``max(1, ln(p + 1) / ln L)``: hf_posenc's ``"rerope+logn"`` and ``"leaky-rerope+logn"``.
* STRING (An et al. 2025, arXiv 2410.18745): HKUNLP/STRING ``string_for_llama.py``, run there with transformers
  4.43.3 and flash attention.

The main process makes seeded random weights and computes hf_posenc's logits (this venv's transformers, each
attention backend); each authors' file runs in a subprocess of this script under the transformers version its
authors pin (installed once with pip under ``--cache``), on the same weights and tokens. Where the two compute the
same thing, their logits must agree within 1e-4 (max |difference|). A ``prefill`` case feeds all tokens in one call;
a ``decode`` case the first ones, then one token a call through the authors' KV cache (their decoding branch).

Flash attention needs CUDA: on a CPU it is a stand-in that this script writes, in plain torch
(``flash_attn.flash_attn_func``, ``flash_attn_2_cuda.fwd_kvcache``, float32), with flash-attention's semantics:
``(batch, seqlen, heads, headdim)`` tensors, grouped-query heads, the causal mask and ``window_size=(left, right)``
aligned to the bottom-right corner; a query that sees no key gets output 0 and log-sum-exp +inf, as the CUDA
kernels write; a ``cache_seqlens`` outside the cache is an error (the kernel would read outside it).

The known difference, measured: STRING's prefill (flash attention with ``window_size=[S, 0]`` beside the shifted
triangle) scores the keys at relative distance ``d = S`` twice, at ``S`` and at ``W``; the paper's equation and
the authors' decoding step score them once, at ``W``. The logits differ from position ``S`` on, and agree once the
window is ``[S - 1, 0]`` (a diagnosis case, the authors' file edited). Their decoding step needs more than ``S``
tokens in the cache, so the decode case prefills ``S + 1``; with two layers the prefill's double count at position
``S`` reaches every later step through the second layer's cache, so it runs on the first layer alone too.

    python scripts/compare_authors_remaps.py --rerope-dir DIR --string-file FILE   # the authors' files given
    python scripts/compare_authors_remaps.py    # downloads them at the pinned commits (raw.githubusercontent.com)

Writes benchmarks/results/authors_remaps_cpu.json; exits 1 if a case is not as expected.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_common, imported where used (not in the worker)

TOLERANCE = 1e-4
CONTEXT = 64  # the trained context L: the config's max_position_embeddings
SHAPE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=CONTEXT,
    tie_word_embeddings=False,
    initializer_range=0.1,  # logits of a few units: attention far from flat
)  # RoPE base 10000: the default of every transformers version here
SEED = 0
TOKENS = 128  # the longest case's length
BACKENDS = ("eager", "sdpa")
RAW = "https://raw.githubusercontent.com/{repository}/{commit}/{file}"


@dataclass(frozen=True)
class Source:
    """Where the authors' code lives and the transformers it was run with; ``pins``: the packages that version
    needs in versions other than this venv's (pip installs them beside it, ``--no-deps``; the rest comes from the
    venv)."""

    repository: str
    commit: str
    transformers: str
    pins: tuple[str, ...]


SOURCES = {
    "rerope": Source(
        "bojone/rerope",
        "acfe78840357a94d0bb504cb8865eeaa752df1a6",
        "4.31.0",
        ("tokenizers==0.13.3", "huggingface-hub==0.16.4"),
    ),
    "string": Source(
        "HKUNLP/STRING",
        "216cc2f04cee147e8c3cfaa15723b182ecbe321e",
        "4.43.3",
        ("tokenizers==0.19.1", "huggingface-hub==0.24.5"),
    ),
}


@dataclass(frozen=True)
class Case:
    """One comparison: hf_posenc's ``spec`` with ``params`` against the authors' ``file`` with ``authors`` (module
    globals, or the arguments of their function ``entry``) on the first ``length`` tokens, ``prefill`` of them fed
    in one call (None: all) and the rest one a call, on the first ``layers`` layers. ``differs``: the positions
    ``[start, stop)`` of a known difference (the rest must agree within the tolerance, these must not). ``edit``:
    ``(old, new)``, text replaced once in the authors' file (a diagnosis, not their code)."""

    name: str
    source: str
    file: str
    spec: str
    params: dict
    authors: dict
    entry: str | None = None
    length: int = TOKENS
    prefill: int | None = None
    layers: int = SHAPE["num_hidden_layers"]
    differs: tuple[int, int] | None = None
    edit: tuple[str, str] | None = None
    note: str = ""

    @property
    def path(self) -> str:
        return "prefill" if self.prefill is None else "decode"


RERO = {"window": 16, "original_max_position_embeddings": CONTEXT}
RERO_AUTHORS = {"training_length": CONTEXT, "window": 16}
LEAKY = {**RERO, "k": 4}
LEAKY_AUTHORS = {**RERO_AUTHORS, "scaling_factor": 4}
S, W, STRING_LENGTH = 40, 8, 96  # STRING's reach L + S - W = 96
STRING = dict(
    source="string",
    file="string_for_llama.py",
    spec="string",
    params={"shifted_offset": S, "local_value": W, "original_max_position_embeddings": CONTEXT},
    authors={"max_test_length": STRING_LENGTH, "shifted_offset": S, "small_local_value": W},
    entry="replace_with_string",
    length=STRING_LENGTH,
)
DOUBLE_COUNT = (
    f"The authors' prefill scores the keys at d = S = {S} twice: flash attention with window_size=[S, 0] sees "
    "distances 0..S, the shifted triangle distances S and more; the paper's equation and their decoding step once."
)
DECODE_START = (
    f"Prefill of S + 1 = {S + 1} tokens, then one decoding step a token: the earliest start their code runs as "
    "meant. A prefill of fewer than S - W tokens raises IndexError (the shifted queries' negative positions index "
    "cos); a decoding step that brings the cache to fewer than S tokens slices it from a negative start (the kernel "
    "would read outside the cache; the stand-in raises) or raises that IndexError; a prefill or step that brings it "
    "to exactly S runs the shifted part on no keys (output 0, log-sum-exp +inf), so that layer's attention output "
    "is 0."
)
CASES = (
    Case("rerope prefill", "rerope", "rerope_patch.py", "rerope+logn", RERO, RERO_AUTHORS),
    Case("rerope decode", "rerope", "rerope_patch.py", "rerope+logn", RERO, RERO_AUTHORS, prefill=1),
    Case("leaky-rerope prefill", "rerope", "leaky_rerope_patch.py", "leaky-rerope+logn", LEAKY, LEAKY_AUTHORS),
    Case(
        "leaky-rerope decode", "rerope", "leaky_rerope_patch.py", "leaky-rerope+logn", LEAKY, LEAKY_AUTHORS, prefill=1
    ),
    Case("string prefill", **STRING, differs=(S, STRING_LENGTH), note=DOUBLE_COUNT),
    Case(
        "string prefill, window S - 1",
        **STRING,
        edit=("window_size=[diag_size, 0]", "window_size=[diag_size - 1, 0]"),
        note="A diagnosis of 'string prefill': the authors' file with its prefill's flash attention window narrowed "
        "to window_size=[S - 1, 0] (distances 0..S-1), so that d = S is scored once, in the shifted triangle.",
    ),
    Case(
        "string decode",
        **STRING,
        prefill=S + 1,
        differs=(S, STRING_LENGTH),
        note=f"{DECODE_START} {DOUBLE_COUNT} Here position S is their prefill's, and in two layers its double count "
        "reaches every later step through the second layer's cache.",
    ),
    Case(
        "string decode, first layer",
        **STRING,
        prefill=S + 1,
        layers=1,
        differs=(S, S + 1),
        note=f"{DECODE_START} The first layer alone (the same weights): its cache holds no attention output, so only "
        "position S, their prefill's, carries the double count, and every decoding step computes the paper's equation.",
    ),
)

FLASH_STUB = {
    "flash_attn_2_cuda.py": '''
"""CPU stand-in for flash-attention 2's CUDA extension, in plain torch (float32)."""

import torch


def attention(q, k, v, softmax_scale, causal, window_left, window_right):
    """flash-attention's forward: q (batch, seqlen_q, heads, headdim), k and v (batch, seqlen_k, heads_k, headdim)
    with heads divisible by heads_k; the causal mask and the window aligned to the bottom-right corner (query i
    sees keys i + seqlen_k - seqlen_q - left .. i + seqlen_k - seqlen_q + right, -1 unbounded; causal: right = 0).
    Returns out in q's dtype and the log-sum-exp (batch, heads, seqlen_q) in float32; a query that sees no key
    gets out 0 and log-sum-exp +inf, as the kernels write."""
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    groups = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(groups, dim=2).float() for x in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) * softmax_scale
    i = torch.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q
    j = torch.arange(seqlen_k)[None, :]
    right = 0 if causal else window_right
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if window_left >= 0:
        visible &= j >= i - window_left
    if right >= 0:
        visible &= j <= i + right
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.where(visible, torch.exp(scores - lse[..., None]), 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v).to(q.dtype)
    return out, lse.masked_fill(lse == float("-inf"), float("inf"))


def fwd_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin, cache_batch_idx, block_table,
                alibi_slopes, out, softmax_scale, causal, window_left, window_right, rotary_interleaved, num_splits):
    """mha_fwd_kvcache: attention of q over the first cache_seqlens[b] entries of each batch's cache; returns
    [out, softmax_lse]. Appending k, v, rotary, paged or reindexed caches, ALiBi: not in this stand-in."""
    extras = {"k": k, "v": v, "rotary_cos": rotary_cos, "rotary_sin": rotary_sin, "cache_batch_idx": cache_batch_idx,
              "block_table": block_table, "alibi_slopes": alibi_slopes, "out": out}
    given = [name for name, value in extras.items() if value is not None]
    if given:
        raise NotImplementedError(f"fwd_kvcache stand-in: {', '.join(given)} not supported")
    lengths = cache_seqlens.tolist()
    if not all(0 <= n <= k_cache.shape[1] for n in lengths):
        raise ValueError(f"cache_seqlens {lengths} outside 0..{k_cache.shape[1]}: the kernel would read outside it")
    runs = [attention(q[b : b + 1], k_cache[b : b + 1, :n], v_cache[b : b + 1, :n], softmax_scale, causal,
                      window_left, window_right) for b, n in enumerate(lengths)]
    return [torch.cat([o for o, _ in runs]), torch.cat([lse for _, lse in runs])]
''',
    "flash_attn/__init__.py": '''
"""CPU stand-in for flash-attention 2's Python interface (what string_for_llama.py imports)."""

from flash_attn_2_cuda import attention


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func without dropout or ALiBi: out, or (out, softmax_lse, None) with return_attn_probs."""
    if dropout_p or alibi_slopes is not None:
        raise NotImplementedError("flash_attn_func stand-in: dropout and ALiBi not supported")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out, lse = attention(q, k, v, scale, causal, *window_size)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_with_kvcache(*args, **kwargs):
    raise NotImplementedError("not in the stand-in: string_for_llama.py calls flash_attn_2_cuda.fwd_kvcache itself")
''',
    "flash_attn/losses/__init__.py": "",
    "flash_attn/losses/cross_entropy.py": "from torch.nn import CrossEntropyLoss  # noqa: F401\n",
}


def build_model(layers: int) -> torch.nn.Module:
    """The tiny Llama with ``layers`` layers and eager attention, under whichever transformers is imported."""
    from transformers import LlamaConfig, LlamaForCausalLM  # here: the worker's is the authors' version

    config = LlamaConfig(**{**SHAPE, "num_hidden_layers": layers}, attn_implementation="eager")
    return LlamaForCausalLM(config).float().eval()


def first_layers(state: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """``state`` without the decoder layers from ``layers`` on."""
    dropped = tuple(f"model.layers.{i}." for i in range(layers, SHAPE["num_hidden_layers"]))
    return {name: value for name, value in state.items() if not name.startswith(dropped)}


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``state`` into ``model``; only rotary buffers (``inv_freq``, recomputed alike) may be missing or extra."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    others = [name for name in missing + unexpected if "rotary_emb" not in name]
    if others:
        raise RuntimeError(f"weights do not match the model: {others}")


@torch.no_grad()
def hf_posenc_logits(state: dict[str, torch.Tensor], ids: torch.Tensor, case: Case, backend: str) -> torch.Tensor:
    """hf_posenc's logits of one full forward."""
    import hf_posenc

    model = build_model(case.layers)
    load_weights(model, first_layers(state, case.layers))
    hf_posenc.patch(model, case.spec, backend=backend, **case.params)
    return model(ids).logits.float()


@torch.no_grad()
def fed_logits(model: torch.nn.Module, ids: torch.Tensor, prefill: int | None) -> torch.Tensor:
    """The logits of ``ids`` fed as ``prefill`` tokens in one call (None: all), then one token a call through the
    KV cache the model returns (``use_cache=True``: STRING's code allocates its own cache only then)."""
    prefill = ids.shape[1] if prefill is None else prefill
    out = model(ids[:, :prefill], use_cache=True)
    logits = [out.logits]
    for t in range(prefill, ids.shape[1]):
        position = torch.tensor([[t]])
        out = model(ids[:, t : t + 1], position_ids=position, past_key_values=out.past_key_values, use_cache=True)
        logits.append(out.logits)
    return torch.cat(logits, dim=1).float()


def worker(job_path: Path) -> None:
    """The subprocess: the authors' file applied under their transformers, the logits saved to the job's output."""
    import transformers

    job = json.loads(job_path.read_text())
    module = importlib.import_module(Path(job["file"]).stem)
    if job["entry"]:
        getattr(module, job["entry"])(**job["authors"])
    else:
        for name, value in job["authors"].items():
            setattr(module, name, value)  # read at model build (leaky's _init_rope) and at every call
    model = build_model(job["layers"])
    load_weights(model, torch.load(job["weights"], weights_only=True))
    ids = torch.tensor([job["ids"]])
    logits = fed_logits(model, ids, job["prefill"])
    torch.save({"logits": logits, "transformers": transformers.__version__}, job["output"])


def install_transformers(source: Source, cache: Path) -> Path:
    """The folder holding ``transformers==source.transformers`` and its ``pins`` (pip, once per cache)."""
    target = cache / f"transformers-{source.transformers}"
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=cache))
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(partial)]
    try:
        subprocess.run([*command, f"transformers=={source.transformers}", *source.pins], check=True)
    except subprocess.CalledProcessError as error:
        shutil.rmtree(partial)
        raise SystemExit(f"pip could not install transformers=={source.transformers}: {error}") from error
    partial.rename(target)
    return target


def authors_file(case: Case, args: argparse.Namespace) -> Path:
    """The authors' file: ``--rerope-dir``'s or ``--string-file``, else downloaded once at the pinned commit into
    ``--cache``."""
    rerope = args.rerope_dir / case.file if args.rerope_dir else None
    given = {"rerope": rerope, "string": args.string_file}[case.source]
    if given is not None:
        if not given.is_file():
            raise SystemExit(f"{given}: no such file (the authors' {case.file})")
        return given
    source = SOURCES[case.source]
    path = args.cache / f"{source.repository.replace('/', '+')}-{source.commit[:7]}" / case.file
    if not path.is_file():
        url = RAW.format(repository=source.repository, commit=source.commit, file=case.file)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                text = response.read()
        except OSError as error:
            raise SystemExit(f"could not download {url} ({error}); pass --rerope-dir / --string-file") from error
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text)
    return path


def write_flash_stub(folder: Path) -> None:
    """The flash-attention stand-in (``FLASH_STUB``) as importable files under ``folder``."""
    for name, text in FLASH_STUB.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip())


def authors_logits(case: Case, file: Path, site: Path, work: Path, ids: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The authors' logits and the transformers version they ran under: a subprocess of this script with
    ``site`` (their transformers) and a folder holding their file and the flash stand-in first on its path."""
    code = work / case.name.replace(" ", "-").replace(",", "")
    write_flash_stub(code)
    text = file.read_text()
    if case.edit:
        old, new = case.edit
        if text.count(old) != 1:
            raise SystemExit(f"{case.name}: {old!r} is not in {file} exactly once; the diagnosis does not apply")
        text = text.replace(old, new)
    (code / case.file).write_text(text)
    job = {
        "file": case.file,
        "entry": case.entry,
        "authors": case.authors,
        "layers": case.layers,
        "prefill": case.prefill,
        "ids": ids[0].tolist(),
        "weights": str(work / "weights.pt"),
        "output": str(code / "logits.pt"),
    }
    (code / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(code)])}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(code / "job.json")]
    done = subprocess.run(command, env=env, cwd=code, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{case.name}: the authors' code failed under their transformers:\n{done.stderr[-4000:]}")
    result = torch.load(code / "logits.pt", weights_only=True)
    return result["logits"], result["transformers"]


def spans(positions: list[int]) -> str:
    """Positions as runs: ``"40..95"``, ``"3, 7..9"``; empty: ``""``."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def compare(case: Case, ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    """Max |difference| over all positions, those meant to agree, those of the known difference and (decode) the
    decoding steps', and the positions over the tolerance; ``ok``: the meant-to-agree within it, the known difference
    (where there is one) beyond it."""
    diff = (ours - theirs).abs().amax(dim=-1)[0]
    known = torch.zeros(diff.numel(), dtype=torch.bool)
    if case.differs:
        known[slice(*case.differs)] = True
    meant_equal = diff[~known].max().item()
    known_difference = diff[known].max().item() if case.differs else None
    return {
        "all": diff.max().item(),
        "meant_equal": meant_equal,
        "known_difference": known_difference,
        **({"decode_steps": diff[case.prefill :].max().item()} if case.prefill is not None else {}),
        "positions_over_tolerance": spans(torch.nonzero(diff > TOLERANCE)[:, 0].tolist()),
        "ok": meant_equal <= TOLERANCE and (known_difference is None or known_difference > TOLERANCE),
    }


def run_case(case: Case, state: dict, ids: torch.Tensor, file: Path, site: Path, work: Path) -> dict:
    """One case: the authors' logits against hf_posenc's with each backend, as a results entry."""
    ids = ids[:, : case.length]
    torch.save(first_layers(state, case.layers), work / "weights.pt")
    theirs, version = authors_logits(case, file, site, work, ids)
    diffs = {backend: compare(case, hf_posenc_logits(state, ids, case, backend), theirs) for backend in BACKENDS}
    source = SOURCES[case.source]
    return {
        "case": case.name,
        "method": case.spec,
        "params": case.params,
        "authors_settings": {**({"function": case.entry} if case.entry else {}), **case.authors},
        "authors_code": {
            "repository": source.repository,
            "commit": source.commit,
            "file": case.file,
            "sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
            **({"edited": {"from": case.edit[0], "to": case.edit[1]}} if case.edit else {}),
        },
        "transformers": {"pinned": source.transformers, "used": version},
        "length": case.length,
        "layers": case.layers,
        "path": case.path,
        **({"prefill_tokens": case.prefill} if case.prefill is not None else {}),
        "known_difference_positions": spans(list(range(*case.differs))) if case.differs else None,
        "max_abs_logit": theirs.abs().max().item(),
        "max_abs_diff": diffs,
        "ok": all(d["ok"] for d in diffs.values()),
        "note": case.note,
    }


def results(cases: list[dict]) -> dict:
    """The results JSON: the cases, how they were run, the machine and versions."""
    from bench_common import environment

    import hf_posenc

    return {
        "what": "hf_posenc's ReRoPE, Leaky ReRoPE (with log-n) and STRING against the authors' published code, each "
        "under the transformers version its authors pin: max |difference| of the logits of one tiny random Llama",
        "tolerance": TOLERANCE,
        "model": {**SHAPE, "rope_theta": 10000.0, "seed": SEED, "dtype": "float32", "attention": "eager"},
        "tokens": f"the first `length` of torch.randint(0, {SHAPE['vocab_size']}, (1, {TOKENS})) seeded {SEED + 1}",
        "flash_attention": "on this CPU, a stand-in in plain torch written by this script (flash_attn.flash_attn_func, "
        "flash_attn_2_cuda.fwd_kvcache), not flash-attention's CUDA kernels: its documented semantics, and for a "
        "query that sees no key output 0 and log-sum-exp +inf, as the kernels write",
        "authors_code": {name: asdict(source) for name, source in SOURCES.items()},
        "cases": cases,
        "environment": {**environment(torch.device("cpu")), "hf_posenc": hf_posenc.__version__},
    }


def print_table(cases: list[dict]) -> None:
    """Each case and backend a line: the max |differences| and the positions over the tolerance."""
    columns = {"meant_equal": "meant equal", "known_difference": "known diff", "decode_steps": "decode"}
    print(f"{'case':28} {'transformers':12} {'backend':8}", *(f"{name:>11}" for name in columns.values()), " over")
    for case in cases:
        for backend, d in case["max_abs_diff"].items():
            values = (f"{'-' if d.get(key) is None else format(d[key], '.1e'):>11}" for key in columns)
            used = case["transformers"]["used"]
            print(f"{case['case']:28} {used:12} {backend:8}", *values, f" {d['positions_over_tolerance'] or '-'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # the subprocess's job
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path.home() / ".cache/hf_posenc/authors",
        help="where the authors' transformers versions (and downloaded files) are kept (default: %(default)s)",
    )
    parser.add_argument(
        "--rerope-dir",
        type=Path,
        help="folder holding bojone/rerope's rerope_patch.py and "
        "leaky_rerope_patch.py (default: downloaded at the pinned commit)",
    )
    parser.add_argument("--string-file", type=Path, help="HKUNLP/STRING's string_for_llama.py (default: downloaded)")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/authors_remaps_cpu.json"))
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    from bench_common import write_json

    torch.manual_seed(SEED)
    state = build_model(SHAPE["num_hidden_layers"]).state_dict()
    ids = torch.randint(0, SHAPE["vocab_size"], (1, TOKENS), generator=torch.Generator().manual_seed(SEED + 1))
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            file = authors_file(case, args)
            site = install_transformers(SOURCES[case.source], args.cache)
            entries.append(run_case(case, state, ids, file, site, Path(tmp)))
            print(f"{case.name}: ok={entries[-1]['ok']}", flush=True)
    print_table(entries)
    write_json(args.output, results(entries))
    return 0 if all(entry["ok"] for entry in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
