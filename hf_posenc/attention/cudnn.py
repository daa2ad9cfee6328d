"""Fused causal ALiBi attention from NVIDIA's cuDNN frontend (``pip install hf-posenc[cudnn]``).

cuDNN's SDPA graph has an ALiBi score modifier (``use_alibi_mask``): it adds ``m_h * (j - i)`` to the scaled
logits with ``i, j`` the row and column *indices* and the slopes ``m_h`` it computes itself from the number
of query heads (``get_alibi_slope`` in the frontend: the paper's slopes, power of two or not, as
``tests/test_alibi_cudnn.py`` checks against its source and
:func:`hf_posenc.attention.functions.cudnn_self_check` on the GPU). It only exists
with the top-left causal band (``diagonal_band_right_bound = 0``), so it serves exactly one kind of call: a
causal prefill of equal query and key lengths with no padding — training, and the long forwards of an
evaluation. :func:`hf_posenc.attention.functions.alibi_cudnn_attention` sends every other call (padding, a
KV cache) to the flex backend.

Graphs are built once per shape, layout, dtype and device and kept; a shape cuDNN does not support is
remembered as such (``None``) and left to flex.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch

try:  # the optional extra
    import cudnn
except (ImportError, OSError):  # not installed, or its binary cannot load here: the backend is unavailable
    cudnn = None

logger = logging.getLogger(__name__)

_DTYPES = (torch.float16, torch.bfloat16)


def installed() -> bool:
    """Whether the cuDNN frontend (PyPI ``nvidia-cudnn-frontend``) can be imported."""
    return cudnn is not None


def _data_type(dtype: torch.dtype) -> Any:
    return {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16}[dtype]


def _new_graph(dtype: torch.dtype, handle: Any) -> Any:
    return cudnn.pygraph(
        handle=handle,
        io_data_type=_data_type(dtype),
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )


def _layout(tensor: torch.Tensor) -> tuple:
    return tuple(tensor.shape), tuple(tensor.stride())


def _key(kind: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *details: Any) -> tuple:
    """A graph's cache key: the input layouts (outputs and statistics follow from them), dtype, device, details."""
    return (kind, *map(_layout, (query, key, value)), query.dtype, query.device, *details)


def new_output(query: torch.Tensor) -> torch.Tensor:
    """``(B, H, n, D)`` laid out as ``(B, n, H, D)``: what attention modules reshape without a copy."""
    batch, heads, length, dim = query.shape
    return query.new_empty(batch, length, heads, dim).transpose(1, 2)


def _alibi_causal() -> dict[str, Any]:
    """ALiBi needs the top-left causal band: key ``j`` visible from query ``i`` iff ``j <= i``."""
    return {
        "use_alibi_mask": True,
        "diagonal_band_right_bound": 0,
        "diagonal_alignment": cudnn.diagonal_alignment.TOP_LEFT,
    }


@dataclass
class ForwardGraph:
    """A built forward graph and its tensor handles; ``stats`` is None for inference."""

    graph: Any
    q: Any
    k: Any
    v: Any
    o: Any
    stats: Any


@dataclass
class BackwardGraph:
    graph: Any
    q: Any
    k: Any
    v: Any
    o: Any
    d_o: Any
    stats: Any
    dq: Any
    dk: Any
    dv: Any


def forward_graph(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, training: bool, handle: Any = None
) -> ForwardGraph:
    """The validated (not yet planned) forward graph for these layouts; output as :func:`new_output`.

    Args:
        query (`torch.Tensor`): ``(B, H, q, D)``, any strides; ``key``/``value``: ``(B, H_kv, kv, D)``.
        scale (`float`): the logit scale (``1/sqrt(D)`` usually).
        training (`bool`): also write the softmax statistics ``(B, H, q, 1)`` the backward needs.
        handle: a cuDNN handle; ``None`` is enough to validate the graph (no GPU needed).
    """
    graph = _new_graph(query.dtype, handle)
    q, k, v = (graph.tensor_like(t) for t in (query, key, value))
    o, stats = graph.sdpa(
        name="alibi_sdpa", q=q, k=k, v=v, generate_stats=training, attn_scale=scale, **_alibi_causal()
    )
    output = new_output(query)
    o.set_output(True).set_dim(list(output.shape)).set_stride(list(output.stride()))
    if training:
        stats.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    graph.validate()
    return ForwardGraph(graph, q, k, v, o, stats if training else None)


def backward_graph(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    grad_output: torch.Tensor,
    stats: torch.Tensor,
    scale: float,
    handle: Any = None,
) -> BackwardGraph:
    """The validated backward graph; gradients in the layouts of ``query``, ``key`` and ``value``."""
    graph = _new_graph(query.dtype, handle)
    q, k, v, o, d_o, s = (graph.tensor_like(t) for t in (query, key, value, output, grad_output, stats))
    dq, dk, dv = graph.sdpa_backward(
        name="alibi_sdpa_backward", q=q, k=k, v=v, o=o, dO=d_o, stats=s, attn_scale=scale, **_alibi_causal()
    )
    for grad, like in ((dq, query), (dk, key), (dv, value)):
        grad.set_output(True).set_dim(list(like.shape)).set_stride(list(like.stride()))
    graph.validate()
    return BackwardGraph(graph, q, k, v, o, d_o, s, dq, dk, dv)


def _build_plans(graph: Any) -> None:
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()


@functools.cache
def _handle(device_index: int) -> Any:
    with torch.cuda.device(device_index):
        return cudnn.create_handle()


def _stream_handle(device: torch.device) -> Any:
    """The device's cuDNN handle, bound to the current CUDA stream."""
    handle = _handle(device.index if device.index is not None else torch.cuda.current_device())
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    return handle


_GRAPHS: dict[tuple, Any] = {}


def _cached(key: tuple, build) -> Any:
    """A planned graph from the cache, built on first use; ``None`` (remembered) where cuDNN refuses it."""
    if key not in _GRAPHS:
        try:
            built = build()
            _build_plans(built.graph)
        except cudnn.cudnnGraphNotSupportedError as error:
            logger.warning("cuDNN does not support this ALiBi attention (%s); using flex for it: %s", key, error)
            built = None
        _GRAPHS[key] = built
    return _GRAPHS[key]


def _execute(graph: Any, pack: dict[Any, torch.Tensor], handle: Any) -> None:
    workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=next(iter(pack.values())).device)
    graph.execute(pack, workspace, handle=handle)


def prepare(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, training: bool) -> bool:
    """Whether the fused kernel runs these inputs: CUDA, float16/bfloat16, equal query and key lengths, and
    graphs cuDNN accepts, the backward's too when ``training`` (built and cached here on first use, so the
    call that follows finds them)."""
    if cudnn is None or not query.is_cuda or query.dtype not in _DTYPES or query.shape[2] != key.shape[2]:
        return False
    handle = _stream_handle(query.device)
    build = functools.partial(forward_graph, query, key, value, scale, training, handle)
    if _cached(_key("forward", query, key, value, scale, training), build) is None:
        return False
    if not training:
        return True

    def build_backward() -> BackwardGraph:  # the output and statistics as the forward lays them out
        output = new_output(query)
        return backward_graph(query, key, value, output, output, _new_stats(query), scale, handle)

    return _cached(_key("backward", query, key, value, scale), build_backward) is not None


def _new_stats(query: torch.Tensor) -> torch.Tensor:
    """The softmax statistics the forward keeps for the backward: ``(B, H, n, 1)`` float32."""
    return torch.empty(*query.shape[:3], 1, dtype=torch.float32, device=query.device)


class _FusedAlibi(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, scale, training):
        handle = _stream_handle(query.device)
        graph = _GRAPHS[_key("forward", query, key, value, scale, training)]  # built by prepare()
        output = new_output(query)
        pack = {graph.q: query, graph.k: key, graph.v: value, graph.o: output}
        if training:
            stats = _new_stats(query)
            pack[graph.stats] = stats
        _execute(graph.graph, pack, handle)
        if training:
            ctx.save_for_backward(query, key, value, output, stats)
            ctx.scale = scale
        return output

    @staticmethod
    def backward(ctx, grad_output):
        query, key, value, output, stats = ctx.saved_tensors
        grad_output = grad_output.transpose(1, 2).contiguous().transpose(1, 2)  # the output's layout
        handle = _stream_handle(query.device)
        tensors = (query, key, value, output, grad_output, stats)
        graph = _GRAPHS[_key("backward", query, key, value, ctx.scale)]  # built by prepare(training=True)
        grads = [torch.empty_like(t) for t in (query, key, value)]
        pack = dict(zip((graph.q, graph.k, graph.v, graph.o, graph.d_o, graph.stats), tensors, strict=True))
        pack.update(zip((graph.dq, graph.dk, graph.dv), grads, strict=True))
        _execute(graph.graph, pack, handle)
        return *grads, None, None


def fused_alibi_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal ALiBi attention with the paper's slopes for ``query``'s head count (cuDNN computes them).

    Args:
        query (`torch.Tensor`): ``(B, H, n, D)``; ``key``, ``value``: ``(B, H_kv, n, D)`` with ``H_kv`` dividing
            ``H`` (grouped-query attention runs natively). Call :func:`prepare` first.
        scale (`float`): the logit scale.

    Returns:
        `torch.Tensor`: ``(B, H, n, D)`` whose memory is ``(B, n, H, D)``-contiguous. Differentiable.
    """
    return _FusedAlibi.apply(query, key, value, scale, needs_grad(query, key, value))


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether a backward can follow (then the forward keeps the softmax statistics)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
