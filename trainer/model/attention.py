"""Block-causal attention back-ends: which one to load a model with, and PyTorch's varlen kernel.

Every back-end here keeps packed samples apart when the model gets the inputs of
``packfeed.client.to_model_inputs`` (see docs/design.md, "Block-causal attention"):

=====================  ======  ================================================================
attn_implementation    device  how samples are kept apart
=====================  ======  ================================================================
flash_attention_2      CUDA    flash-attn 2.x varlen kernel on cu_seq_lens_q/k
flash_attention_4      SM90+   flash-attn-4 (CuTe DSL) varlen kernel on cu_seq_lens_q/k
packfeed_varlen        CUDA    ``torch.nn.attention.varlen.varlen_attn`` on cu_seq_lens_q/k,
                               registered with ``transformers.AttentionInterface``; no extra
                               package to compile
sdpa, eager            any     dense [B, 1, L, L] mask that transformers builds from restarting
                               position_ids (attention_mask None, use_cache False): correct,
                               O(L^2) memory per row; the CPU path
=====================  ======  ================================================================

``select_attention("auto")`` takes the first available of flash_attention_2, flash_attention_4
(SM90+), packfeed_varlen on CUDA, and sdpa elsewhere. A back-end asked for by name that cannot
run raises RuntimeError saying what to install: nothing falls back silently. ``check_attention``
says the same before anything starts, as a user's error (one line, exit 2): on the Ray driver
for train workers it knows run on the CPU (``ray_workers_device``), on a torchrun rank for its
own device.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)

VARLEN = "packfeed_varlen"
FLASH_ATTENTION_2 = "flash_attention_2"
FLASH_ATTENTION_4 = "flash_attention_4"

# What a user may ask for -> the transformers attn_implementation name.
_NAMES = {
    "sdpa": "sdpa",
    "eager": "eager",
    FLASH_ATTENTION_2: FLASH_ATTENTION_2,
    "fa2": FLASH_ATTENTION_2,
    FLASH_ATTENTION_4: FLASH_ATTENTION_4,
    "fa4": FLASH_ATTENTION_4,
    "varlen": VARLEN,
    VARLEN: VARLEN,
}
ATTENTION_CHOICES = ("auto", "sdpa", "eager", FLASH_ATTENTION_2, FLASH_ATTENTION_4, "varlen")


def select_attention(attn: str = "auto", device: Any = None) -> str:
    """The transformers ``attn_implementation`` to load the model with, logged with its reason.

    ``device``: where the model will run (str or torch.device); default CUDA when available.
    ``attn``: "auto" or one of ATTENTION_CHOICES (also "fa2", "fa4", "packfeed_varlen").
    Choosing varlen registers it with transformers, so the returned name can go straight to
    ``from_pretrained(..., attn_implementation=name)``. Raises ValueError for an unknown name
    and RuntimeError when the named back-end cannot run on ``device``.
    """
    import torch

    key = attn.strip().lower()
    if key != "auto" and key not in _NAMES:
        raise ValueError(f"unknown attention back-end {attn!r}; choose one of {ATTENTION_CHOICES}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)

    if key == "auto":
        name, reason = _auto_choice(device)
    else:
        name = _NAMES[key]
        problem = _why_unavailable(name, device)
        if problem is not None:
            raise RuntimeError(problem)
        reason = "asked for by name"
    if name == VARLEN:
        register_varlen_attention()
    logger.info("attention back-end %s on %s: %s", name, device, reason)
    return name


def check_attention(attn: str, device: Any, why: str = "") -> None:
    """ValueError, one line, when the back-end ``attn`` names (``[model] attn``, ``--attn``)
    cannot run on ``device``, where ``select_attention`` would raise in every train worker
    after Ray and the workers started. ``why``: where ``device`` comes from, said in the error
    ("[scaling] use_gpu = no"). "auto" always passes (it picks what runs); an unknown name is
    ModelConfig's error."""
    import torch

    key = attn.strip().lower()
    if key == "auto" or key not in _NAMES:
        return
    problem = _why_unavailable(_NAMES[key], torch.device(device))
    if problem is not None:
        where = f" cannot run on the train workers' device ({why})" if why else ""
        raise ValueError(f"--attn {attn} ([model] attn){where}: {problem}")


def ray_workers_device(use_gpu: str, *, embedded: bool) -> tuple[str, str] | None:
    """("cpu", why) when the Ray Train workers will run on the CPU, as the driver knows before
    Ray starts: ``[scaling] use_gpu = "no"``, or an embedded Ray (``embedded``: this machine
    only) on a machine without a CUDA GPU. None otherwise: GPU workers (their back-end is
    checked where they run; the driver creates no CUDA context to ask), or a cluster's nodes."""
    if use_gpu == "no":
        return "cpu", "the CPU: [scaling] use_gpu = no"
    if not embedded:
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return "cpu", "the CPU: this machine has no CUDA GPU, and the embedded Ray's workers run on it"


def _auto_choice(device: Any) -> tuple[str, str]:
    if device.type != "cuda":
        return "sdpa", "SDPA with the block-causal mask built from position_ids"
    for name in (FLASH_ATTENTION_2, FLASH_ATTENTION_4, VARLEN):
        if _why_unavailable(name, device) is None:
            return name, "first available of flash_attention_2, flash_attention_4 (SM90+), varlen"
    logger.warning(
        "no flash back-end on %s (install flash-attn, or use a torch with "
        "torch.nn.attention.varlen): SDPA builds a dense [B, 1, L, L] mask per batch, correct but slow",
        device,
    )
    return "sdpa", "no flash back-end available"


def _why_unavailable(name: str, device: Any) -> str | None:
    """None when ``name`` can run on ``device``; otherwise what is missing and how to get it."""
    if name in ("sdpa", "eager"):
        return None
    import torch

    if device.type != "cuda" or not torch.cuda.is_available():
        return (
            f"attention back-end {name!r} needs a CUDA GPU, but the device is {device}; "
            "on CPU use 'sdpa' or 'eager' (block-causal through position_ids)"
        )
    major, minor = torch.cuda.get_device_capability(device)
    if name == FLASH_ATTENTION_2:
        from transformers.utils import is_flash_attn_2_available

        if not is_flash_attn_2_available():
            return (
                "flash_attention_2 needs the flash-attn 2.x package (>= 2.3.3): "
                "pip install 'packfeed[gpu]' or pip install flash-attn --no-build-isolation "
                "(it compiles against the CUDA toolkit); or use attn='varlen', which needs none"
            )
        return None
    if name == FLASH_ATTENTION_4:
        from transformers.utils import is_flash_attn_4_available

        if not is_flash_attn_4_available():
            return "flash_attention_4 needs the flash-attn-4 package: pip install --pre flash-attn-4"
        if major < 9:
            return (
                "flash_attention_4 training needs an SM90+ GPU (Hopper or newer); "
                f"this one is SM{major}{minor}"
            )
        return None
    if name == VARLEN:
        if not _torch_has_varlen():
            return (
                f"attn='varlen' needs torch.nn.attention.varlen.varlen_attn, absent from torch "
                f"{torch.__version__}: upgrade torch, or install flash-attn"
            )
        if major < 8:
            return f"attn='varlen' (flash kernel) needs an SM80+ GPU; this one is SM{major}{minor}"
        return None
    raise ValueError(f"unknown attention back-end {name!r}")


def _torch_has_varlen() -> bool:
    try:
        return importlib.util.find_spec("torch.nn.attention.varlen") is not None
    except ModuleNotFoundError:
        return False


# ---------------------------------------------------------------------------------------------
# torch.nn.attention.varlen as a transformers attention function
# ---------------------------------------------------------------------------------------------


def register_varlen_attention() -> str:
    """Register :func:`varlen_attention_forward` with transformers under ``VARLEN``; idempotent.

    The mask side reuses transformers' flash-attention mask function: an all-ones
    attention_mask is dropped, a padding mask reaches the forward, which refuses it.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(VARLEN, varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN, flash_attention_mask)
    return VARLEN


def _check_varlen_call(query: Any, key: Any, attention_mask: Any, *, dropout: float, softcap: float | None,
                       sinks: Any, cu_seq_lens_q: Any, cu_seq_lens_k: Any, max_length_q: int | None,
                       max_length_k: int | None) -> None:
    """What ``varlen_attention_forward`` refuses (its docstring's Raises), each in one line."""
    missing = [
        name
        for name, arg in (
            ("cu_seq_lens_q", cu_seq_lens_q),
            ("cu_seq_lens_k", cu_seq_lens_k),
            ("max_length_q", max_length_q),
            ("max_length_k", max_length_k),
        )
        if arg is None
    ]
    if missing:
        raise ValueError(
            f"{VARLEN} attention needs {missing} to keep packed samples apart; build the model "
            "inputs with packfeed.client.to_model_inputs(batch)"
        )
    if attention_mask is not None:
        raise ValueError(
            f"{VARLEN} attention got an attention_mask with padding: packed rows carry their "
            "boundaries in cu_seq_lens_q/k, pass no attention_mask"
        )
    if softcap is not None or sinks is not None:
        raise NotImplementedError(f"{VARLEN} attention supports neither softcap nor attention sinks")
    if dropout:
        raise ValueError(f"{VARLEN} attention has no attention dropout: set config.attention_dropout=0")

    batch, seq_len = query.shape[0], query.shape[2]
    if key.shape[2] != seq_len:
        raise ValueError(f"{VARLEN} attention is for training without a KV cache: pass use_cache=False")
    if cu_seq_lens_q.dim() != 1 or cu_seq_lens_q.numel() < batch + 1:
        raise ValueError(
            "cu_seq_lens_q must be 1-D global offsets over the B*L flattened tokens with a boundary "
            f"at every row start (at least B+1={batch + 1} entries), got {tuple(cu_seq_lens_q.shape)}"
        )


def varlen_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    cu_seq_lens_q: Any = None,
    cu_seq_lens_k: Any = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Attention over packed rows with PyTorch's varlen flash kernel.

    Shapes follow transformers' attention functions: query [B, H, L, D], key/value
    [B, H_kv, L, D]; returns ([B, L, H, D], None). The B rows are flattened to B*L tokens and
    ``cu_seq_lens_q/k`` (global int32 offsets, a boundary at every row start) delimit the
    samples: for rows [3, 5] and [8] at L=8, [0, 3, 8, 16]. GQA runs on the kv heads as they
    are when the kernel supports it, else kv heads are repeated. A sliding window of S tokens
    (the query included, transformers' convention) becomes window_size (S - 1, 0).

    Raises ValueError without the four cu_seq_lens/max_length kwargs (attending across the
    flattened batch would mix samples), with a padding attention_mask, or with a KV cache.
    """
    import torch

    _check_varlen_call(query, key, attention_mask, dropout=dropout, softcap=softcap, sinks=kwargs.get("s_aux"),
                       cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k, max_length_q=max_length_q,
                       max_length_k=max_length_k)
    batch, num_heads, seq_len, _ = query.shape
    num_kv_heads = key.shape[1]

    def flat(x: Any) -> Any:  # [B, H, L, D] -> [B*L, H, D]
        return x.transpose(1, 2).reshape(batch * seq_len, x.shape[1], x.shape[-1])

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    left = sliding_window - 1 if sliding_window else -1
    out = _varlen_kernel()(
        flat(query),
        flat(key),
        flat(value),
        cu_seq_lens_q.to(device=query.device, dtype=torch.int32),
        cu_seq_lens_k.to(device=query.device, dtype=torch.int32),
        int(max_length_q),
        int(max_length_k),
        scale=scaling,
        window_size=(left, 0) if causal else (left, left),
        enable_gqa=num_kv_heads != num_heads,
    )
    return out.view(batch, seq_len, num_heads, out.shape[-1]), None


@functools.lru_cache(maxsize=None)
def _varlen_kernel() -> Callable[..., Any]:
    """``varlen_attn`` behind one signature across torch releases.

    kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window_size, enable_gqa) with q
    [T, H, D], k/v [T, H_kv, D]. Releases with ``window_size`` read causality from it
    ((-1, 0) is causal); earlier ones take ``is_causal`` and have neither windows nor GQA.
    Inputs that are not bfloat16/float16 are cast to autocast's dtype, or refused. Tests
    replace this function to run the forward on CPU against a reference kernel.
    """
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    has_window, has_gqa = "window_size" in params, "enable_gqa" in params

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window_size, enable_gqa):
        q, k, v = _half_precision(q, k, v)
        options: dict[str, Any] = {"scale": scale}
        if enable_gqa and has_gqa:
            options["enable_gqa"] = True
        elif enable_gqa:
            n_rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
        window_size = tuple(window_size)  # varlen_attn compares it with the tuple (-1, 0)
        if has_window:
            options["window_size"] = window_size
        elif window_size in ((-1, 0), (-1, -1)):
            options["is_causal"] = window_size == (-1, 0)
        else:
            raise NotImplementedError(
                "this torch's varlen_attn has no sliding windows: upgrade torch or use flash_attention_2"
            )
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **options)

    return kernel


def _half_precision(*tensors: Any) -> tuple[Any, ...]:
    """The flash kernel takes bfloat16/float16 only: the query's dtype, else autocast's.

    Under autocast, rotary embeddings can leave q/k in float32 while v is already bfloat16.
    """
    import torch

    query = tensors[0]
    dtype = query.dtype
    if dtype not in (torch.float16, torch.bfloat16):
        if not torch.is_autocast_enabled(query.device.type):
            raise TypeError(
                f"{VARLEN} attention runs in bfloat16/float16, got {dtype}: load the model with "
                "dtype=torch.bfloat16 or run it under torch.autocast"
            )
        dtype = torch.get_autocast_dtype(query.device.type)
    return tuple(t.to(dtype) for t in tensors)
