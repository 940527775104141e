"""timm weights in and out: the one place that knows timm's tags, file formats and loaders.

In:  `create_model(name, pretrained=...)` builds a preset and loads
     - a timm tag ("augreg_in21k_ft_in1k", or a full "vit_base_patch16_224.augreg_in21k"),
       fetched by timm from the Hugging Face hub, or
     - a local file: .safetensors, .pth/.pt/.bin (a timm or vitflash state dict, or a
       {"state_dict"/"model": ...} dict), or a Lightning .ckpt whose network is `model.`
       (or its EMA, `ema.module.`, when the run kept one: see `read_checkpoint`).
     timm does the loading (`timm.models.load_pretrained`): its ViT `checkpoint_filter_fn`
     resamples the position embedding (and patch embedding) when img_size or patch size
     differ, and the head is dropped, keeping its fresh init, when num_classes differs.
     Before timm loads, every key and shape is checked, so a checkpoint that does not fit
     fails with the file named and the difference spelled out.
Out: `export_timm(checkpoint, out)` writes a vitflash model, state dict or Lightning
     checkpoint as a .safetensors file and returns the `timm.create_model` arguments that
     load it: `timm.create_model(**export_timm(ckpt, "model.safetensors"))`.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import socket
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

import huggingface_hub
import safetensors.torch
import timm
import torch
import torch.nn as nn
from timm.models import clean_state_dict, load_pretrained
from timm.models.vision_transformer import checkpoint_filter_fn

import vitflash
from vitflash.model import VisionTransformer, build_model, list_models, preset_kwargs


CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")
# Keys every timm VisionTransformer state dict has; their absence means another architecture.
_VIT_KEYS = ("patch_embed.proj.weight", "pos_embed", "blocks.0.attn.qkv.weight")
# A timm ViT architecture whose constructor takes every keyword of VisionTransformer.config;
# presets timm does not know (the CIFAR ones) are exported as this with explicit arguments.
_TIMM_GENERIC_VIT = "vit_base_patch16_224"
# The EMA of the weights in a ViTModule checkpoint (model.ema_decay): timm's ModelEmaV3 kept as
# `ViTModule.ema`, whose copy of the network is its `module`.
EMA_PREFIX = "ema.module."
# What a ViTModule checkpoint of a run says of its inputs (`ImageDataModule.inputs`: the eval
# transform's settings and the class names), for scripts/predict.py.
INPUTS_KEY = "vitflash_inputs"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not fit the model."""


# ---------------------------------------------------------------------------------------
# Reading files


def load_training_checkpoint(path: str | os.PathLike) -> dict:
    """A checkpoint of scripts/train.py as Lightning saved it (state_dict with the ViTModule's
    `model.` names, hyper_parameters, loops, callbacks...), read weights-only; a CheckpointError
    for any other file."""
    obj = load_file(path)
    if not (isinstance(obj, Mapping) and "state_dict" in obj
            and "model_name" in (obj.get("hyper_parameters") or {})):
        raise CheckpointError(
            f"{path} is not a checkpoint of scripts/train.py (it has no ViTModule "
            "hyper-parameters): pass <run>/checkpoints/last.ckpt or the best .ckpt of a run; "
            "plain weights go to model.pretrained=")
    return obj


def read_checkpoint(
    path: str | os.PathLike, training: bool = False
) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a checkpoint file into (state_dict with timm/vitflash names, hyper_parameters).

    Accepts .safetensors and torch.save files holding a state dict, a {"state_dict": ...}
    or {"model": ...} dict, or a Lightning checkpoint (keys `model.*` of its state_dict are
    the network; `hyper_parameters` is returned, {} when absent). A checkpoint of a run with
    model.ema_decay gives the EMA of the weights (keys `ema.module.*`), the weights it
    validated and chose as best; any other gives the trained weights. DDP/torch.compile
    prefixes are removed with timm's `clean_state_dict`. With `training`, the file must be
    a checkpoint of scripts/train.py (a Lightning checkpoint with the ViTModule's
    hyper-parameters), as resuming and scripts/eval.py need.
    """
    return checkpoint_weights(load_training_checkpoint(path) if training else load_file(path), path)


def checkpoint_weights(obj, path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """`read_checkpoint` of a file's object already read (`path` names it in errors)."""
    hparams: dict = {}
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, Mapping):
        if isinstance(obj.get("hyper_parameters"), Mapping):
            hparams = dict(obj["hyper_parameters"])
        for key in ("state_dict", "model"):
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping):
        raise CheckpointError(
            f"checkpoint {path} holds a {type(obj).__name__}, not a state dict: save "
            f"model.state_dict() (or a Lightning checkpoint) instead"
        )
    state_dict = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    # A LightningModule holds the network as `self.model`, and its EMA (if any) as `self.ema`:
    # keep one of them, and none of its other state (metrics).
    prefix = EMA_PREFIX if any(k.startswith(EMA_PREFIX) for k in state_dict) else "model."
    if any(k.startswith(prefix) for k in state_dict):
        state_dict = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    state_dict = clean_state_dict(state_dict)
    if not state_dict:
        raise CheckpointError(f"checkpoint {path} holds no tensors")
    return state_dict, hparams or _exported_arguments(path)


def _exported_arguments(path: str | os.PathLike) -> dict:
    """The model arguments that export_timm writes into a .safetensors file's metadata (its
    preset as model_name, and timm's keyword arguments: pooling, layer scale...), {} for
    any other file: where the weights leave something open, the file still says it."""
    if Path(path).suffix != ".safetensors":
        return {}
    with safetensors.safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    if "timm_kwargs" not in meta:
        return {}
    return {"model_name": meta.get("vitflash_model") or None, **json.loads(meta["timm_kwargs"])}


def load_file(path: str | os.PathLike):
    """The object saved in a checkpoint file (.safetensors, or torch.save), on the CPU: the one
    reader of checkpoint files in vitflash, with errors that say what to do.

    torch.save files are read with weights_only=True: a file unpickled in full can run code,
    so vitflash never does that on its own.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            f"checkpoint {path} is a folder, not a file: pass a checkpoint file inside it "
            "(a training run keeps them in <run dir>/checkpoints/, e.g. last.ckpt)")
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {path} does not exist: check the path (a training run keeps its "
            "checkpoints in <run dir>/checkpoints/)")
    try:
        if path.suffix == ".safetensors":
            return safetensors.torch.load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only names the Python object it refused ("Unsupported global: ..."); any
        # other unpickling error is a damaged file.
        if "unsupported global" in str(e).lower():
            raise CheckpointError(
                f"checkpoint {path} holds pickled Python objects besides tensors (e.g. "
                "hyper-parameters of another training script), which vitflash does not "
                "unpickle. If you trust the file, save its weights alone and pass that file: "
                "`ckpt = torch.load(path, weights_only=False); torch.save(ckpt.get("
                "'state_dict', ckpt), 'weights.pth')`") from e
        error = e
    except Exception as e:  # torch and safetensors raise several types for damaged files
        error = e
    raise CheckpointError(
        f"cannot read checkpoint {path}: it is truncated, corrupt, or not a PyTorch/safetensors "
        f"checkpoint ({type(error).__name__}: {_load_detail(error)}). Re-download or re-save it, or "
        "use another checkpoint of the run (last.ckpt or the best one)") from error


def _load_detail(error: Exception) -> str:
    """What went wrong in a failed load, in one line. torch's weights-only unpickler wraps its
    finding ("Unsupported operand 103") in a paragraph whose advice, to load with
    weights_only=False, does not apply to a damaged file: only the finding is kept."""
    text = str(error)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


# ---------------------------------------------------------------------------------------
# What a state dict says about its architecture, and whether it fits a model


def _check_is_vit(state_dict: Mapping[str, torch.Tensor], source: str) -> None:
    missing = [k for k in _VIT_KEYS if k not in state_dict]
    if missing:
        some = ", ".join(list(state_dict)[:5])
        raise CheckpointError(
            f"checkpoint {source} is not a timm/vitflash VisionTransformer: it lacks "
            f"{', '.join(missing)} (its first keys are {some}). Pass a ViT checkpoint "
            f"saved by vitflash, by Lightning with vitflash, or by timm"
        )
    for key, what in (("reg_token", "register tokens"), ("dist_token", "a distillation token")):
        if key in state_dict:
            raise CheckpointError(
                f"checkpoint {source} has {what} ({key}), which vitflash's ViT does not have: "
                f"pass the weights of a plain ViT (timm's vit_* and deit_* tags without reg or "
                f"distilled in the name)")
    tokens, prefix = state_dict["pos_embed"].shape[1], int("cls_token" in state_dict)
    if math.isqrt(tokens - prefix) ** 2 != tokens - prefix:
        raise CheckpointError(
            f"checkpoint {source}'s pos_embed has {tokens} tokens, not "
            f"{'a class token and ' if prefix else ''}a square grid of patches as in vitflash's "
            f"ViT (timm's no_embed_class models, e.g. deit3, keep the class token out of it): "
            f"pass the weights of a plain ViT")
    # model.shifted_patches (ShiftedPatchEmbed), model.locality_attention (Attention.log_scale)
    for key, what, option in (("patch_embed.norm.weight", "tokenizes with shifted patches", "shifted_patches"),
                              ("blocks.0.attn.log_scale", "has locality self-attention", "locality_attention")):
        if key in state_dict:
            raise CheckpointError(
                f"checkpoint {source} {what} (model.{option}=true), which timm's ViT does not "
                f"have: it does not load as timm weights nor export to timm. Its Lightning "
                f"checkpoint still evaluates and resumes (scripts/eval.py ckpt_path=..., "
                f"scripts/train.py ckpt_path=...)"
            )


def architecture_of(state_dict: Mapping[str, torch.Tensor]) -> dict:
    """The VisionTransformer keyword arguments a ViT state dict determines.

    Returns patch_size, in_chans, embed_dim, depth, mlp_ratio, qkv_bias, class_token,
    num_classes (0 without a head), layer_scale (bool), num_tokens, img_size when the
    patch grid is square, and global_pool/fc_norm when the weights show average pooling.
    num_heads is not in the weights.
    """
    patch_w = state_dict["patch_embed.proj.weight"]  # (embed_dim, in_chans, p, p)
    embed_dim = patch_w.shape[0]
    class_token = "cls_token" in state_dict
    has_fc_norm = "fc_norm.weight" in state_dict
    block_ids = {int(k.split(".")[1]) for k in state_dict if k.startswith("blocks.")}
    arch = dict(
        patch_size=patch_w.shape[-1],
        in_chans=patch_w.shape[1],
        embed_dim=embed_dim,
        depth=max(block_ids) + 1,
        mlp_ratio=state_dict["blocks.0.mlp.fc1.weight"].shape[0] / embed_dim,
        qkv_bias="blocks.0.attn.qkv.bias" in state_dict,
        class_token=class_token,
        num_classes=state_dict["head.weight"].shape[0] if "head.weight" in state_dict else 0,
        layer_scale="blocks.0.ls1.gamma" in state_dict,
        num_tokens=state_dict["pos_embed"].shape[1],
    )
    grid = math.isqrt(arch["num_tokens"] - int(class_token))
    if grid * grid == arch["num_tokens"] - int(class_token):
        arch["img_size"] = grid * arch["patch_size"]
    # Without fc_norm, class-token and average pooling have the same weights: left open.
    if has_fc_norm or not class_token:
        arch.update(global_pool="avg", fc_norm=has_fc_norm)
    return arch


def _arguments_of(arch: dict, hparams: Mapping, name: str) -> dict:
    """The VisionTransformer keyword arguments beyond preset `name`'s that a checkpoint
    decides: from its weights (`arch`, architecture_of) the head size, class token, qkv bias
    and layer scale, and the pooling where the weights show it; from the model arguments
    saved with it (`hparams`: a run's hyper-parameters, an exported file's metadata) the
    pooling where they name it, which the weights leave open with a class token (token
    pooling, or the mean with or without fc_norm)."""
    kwargs = {k: arch[k] for k in ("num_classes", "class_token", "qkv_bias", "global_pool", "fc_norm")
              if k in arch}
    if hparams.get("global_pool") in ("token", "avg"):
        kwargs["global_pool"] = hparams["global_pool"]
        fc_norm = hparams.get("fc_norm")
        kwargs["fc_norm"] = fc_norm if isinstance(fc_norm, bool) else hparams["global_pool"] == "avg"
    if arch["layer_scale"]:
        # The value only seeds gamma, which the checkpoint overwrites.
        kwargs["init_values"] = preset_kwargs(name).get("init_values") or 1e-5
    return kwargs


def _describe(arch: dict) -> str:
    return (
        f"embed_dim {arch['embed_dim']}, depth {arch['depth']}, patch {arch['patch_size']}, "
        f"mlp_ratio {arch['mlp_ratio']:g}, {arch['num_tokens']} tokens, "
        f"{'a' if arch['class_token'] else 'no'} class token, "
        f"{'layer scale' if arch['layer_scale'] else 'no layer scale'}, "
        f"{arch['num_classes']} classes"
    )


def _check_fits(
    state_dict: Mapping[str, torch.Tensor], model: VisionTransformer, source: str, skip_head: bool
) -> None:
    """Every key and shape of `model` in `state_dict` and nothing else (head aside when it
    is to be replaced), else a CheckpointError naming the differences."""
    expected = {k: v.shape for k, v in model.state_dict().items()}
    got = {k: v.shape for k, v in state_dict.items()}
    # The first layer (embed_dim, in_chans, p, p): after this check timm's loader adapts its
    # input channels to the model's (RGB weights into in_chans=1: the kernels summed)
    conv = "patch_embed.proj.weight"
    if conv in got and conv in expected and got[conv][:1] + got[conv][2:] == expected[conv][:1] + expected[conv][2:]:
        got[conv] = expected[conv]
    if skip_head:
        expected = {k: s for k, s in expected.items() if not k.startswith("head.")}
        got = {k: s for k, s in got.items() if not k.startswith("head.")}
    missing = [k for k in expected if k not in got]
    unexpected = [k for k in got if k not in expected]
    wrong = [f"{k} {tuple(got[k])} vs {tuple(s)}" for k, s in expected.items()
             if k in got and got[k] != s]  # fmt: skip
    if not (missing or unexpected or wrong):
        return
    problems = []
    for label, items in (("missing", missing), ("unexpected", unexpected),
                         ("shape (checkpoint vs model)", wrong)):  # fmt: skip
        if items:
            more = f" and {len(items) - 4} more" if len(items) > 4 else ""
            problems.append(f"{label}: {', '.join(items[:4])}{more}")
    raise CheckpointError(
        f"checkpoint {source} does not fit {model.preset or 'the model'} "
        f"({'; '.join(problems)}). The checkpoint has {_describe(architecture_of(state_dict))}; "
        f"pick the preset of that shape or pass matching overrides (e.g. depth=..., "
        f"global_pool='avg')"
    )


def _state_dict_cfg(state_dict: dict, arch: dict, model: VisionTransformer) -> dict:
    """A timm pretrained_cfg that hands `state_dict` (of architecture `arch`) to timm's
    loader, as timm's own cfgs hand it a file or a hub id."""
    size = arch.get("img_size", model.config["img_size"])
    return dict(state_dict=state_dict, num_classes=arch["num_classes"],
                input_size=(arch["in_chans"], size, size), first_conv="patch_embed.proj",
                classifier="head")  # fmt: skip


def _load(model: VisionTransformer, pretrained_cfg: dict, source: str) -> None:
    """Load through timm's `load_pretrained`, with timm's ViT filter behind our checks."""
    src_classes = pretrained_cfg["num_classes"]

    def filter_fn(state_dict, model):
        _check_is_vit(state_dict, source)
        state_dict = checkpoint_filter_fn(state_dict, model)  # resamples pos/patch embed
        _check_fits(state_dict, model, source, skip_head=src_classes != model.num_classes)
        return state_dict

    # load_pretrained drops the head when num_classes differs (and then loads non-strict;
    # filter_fn has already checked every other key).
    load_pretrained(
        model,
        pretrained_cfg=pretrained_cfg,
        num_classes=model.num_classes,
        in_chans=model.in_chans,
        filter_fn=filter_fn,
        strict=True,
    )


# ---------------------------------------------------------------------------------------
# In


def create_model(
    name: str,
    attention: str = "sdpa",
    num_classes: int | None = None,
    img_size: int | None = None,
    pretrained: str | os.PathLike | None = None,
    **overrides,
) -> VisionTransformer:
    """Build preset `name` (see `vitflash.list_models()`), optionally with weights.

    Args:
        name: a preset name, e.g. "vit_base_patch16_224" or "vit_micro_patch4_32".
        attention: "flash", "naive" or "sdpa"; `model.set_attention` switches it later.
        num_classes: head size; None takes the pretrained weights' (or the preset's).
            When it differs from the weights', the head starts fresh.
        img_size: input side; None takes the timm tag's (or the preset's). When it differs
            from the weights', the position embedding is resampled.
        pretrained: None (random init); a timm tag of `name` ("augreg_in21k_ft_in1k") or a
            full timm name ("vit_base_patch16_224.augreg_in21k"), fetched through timm from
            the Hugging Face hub; or the path of a local checkpoint file (see
            `read_checkpoint`).
        overrides: further VisionTransformer keyword arguments (depth=2, drop_path_rate=0.1).
    Returns:
        the model, in train mode. Loaded from a timm tag it carries timm's
        `pretrained_cfg` (mean/std of its training data) as `model.pretrained_cfg`.
    """
    preset_kwargs(name)  # an unknown name fails before any download or file read
    sizes = {k: v for k, v in (("num_classes", num_classes), ("img_size", img_size)) if v is not None}
    if pretrained is None:
        return build_model(name, attention, **sizes, **overrides)
    if _is_local(pretrained):
        return _create_from_file(name, Path(pretrained), attention, sizes, overrides)
    return _create_from_timm(name, str(pretrained), attention, sizes, overrides)


def _is_local(pretrained: str | os.PathLike) -> bool:
    if isinstance(pretrained, os.PathLike) or os.path.exists(pretrained):
        return True
    return pretrained.endswith(CHECKPOINT_SUFFIXES) or "/" in pretrained or os.sep in pretrained


def _create_from_file(
    name: str, path: Path, attention: str, sizes: dict, overrides: dict
) -> VisionTransformer:
    state_dict, hparams = read_checkpoint(path)
    _check_is_vit(state_dict, str(path))
    arch = architecture_of(state_dict)
    # The file decides the head, pooling, bias and layer scale unless the caller says otherwise.
    kwargs = _arguments_of(arch, hparams, name)
    kwargs.update(sizes, **overrides)
    model = build_model(name, attention, **kwargs)
    _load(model, _state_dict_cfg(state_dict, arch, model), source=str(path))
    return model


def _create_from_timm(
    name: str, pretrained: str, attention: str, sizes: dict, overrides: dict
) -> VisionTransformer:
    full = pretrained if "." in pretrained else f"{name}.{pretrained}"
    if full not in timm.list_pretrained(full):
        tags = [t.split(".", 1)[1] for t in timm.list_pretrained(f"{name}.*")]
        raise ValueError(
            f"timm has no pretrained weights {full!r}. Tags for {name}: "
            f"{', '.join(tags) if tags else 'none (not a timm architecture)'}; or pass the "
            f"path of a local checkpoint file"
        )
    cfg = timm.models.get_pretrained_cfg(full).to_dict()
    hub_id = cfg.get("hf_hub_id")
    if not hub_id:
        raise ValueError(
            f"timm's weights {full!r} are not on the Hugging Face hub ({cfg.get('url')}); "
            f"choose another tag, or convert them with timm and pass the file"
        )
    # timm fetches model.safetensors (a hf_hub_filename of the cfg overrides it)
    filename = cfg.get("hf_hub_filename") or "model.safetensors"
    offline_hint = (
        f"On a machine that is online, fetch {filename} of the hub repository {hub_id} "
        f"(https://huggingface.co/{hub_id}/resolve/main/{filename}, or `huggingface-cli download "
        f"{hub_id} {filename}`), copy it here and pass its path: "
        f"model.pretrained=/path/to/{filename} (Python: create_model({name!r}, pretrained=path))"
    )
    cached = huggingface_hub.try_to_load_from_cache(hub_id, filename)
    if isinstance(cached, str):
        # timm reads the hub's cached copy (a plain state dict): no request at all
        cfg.update(file=cached, custom_load=False)
    elif huggingface_hub.constants.HF_HUB_OFFLINE or not _hub_reachable():
        why = ("HF_HUB_OFFLINE is set" if huggingface_hub.constants.HF_HUB_OFFLINE
               else f"cannot reach the Hugging Face hub ({huggingface_hub.constants.ENDPOINT})")
        raise vitflash.SetupError(f"{why} and timm weights {full!r} are not in the hub's local cache. {offline_hint}")
    kwargs = {"num_classes": cfg["num_classes"], "img_size": cfg["input_size"][-1]}
    kwargs.update(sizes, **overrides)
    model = build_model(name, attention, **kwargs)
    try:
        _load(model, cfg, source=full)
    except CheckpointError:
        raise
    except Exception as e:
        if isinstance(huggingface_hub.try_to_load_from_cache(hub_id, filename), str):
            # fetched (or cached already): the weights themselves do not load into the model
            raise CheckpointError(f"timm weights {full!r} do not load into {name} ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''})") from e
        raise vitflash.SetupError(
            f"could not fetch timm weights {full!r} from the Hugging Face hub "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). {offline_hint}"
        ) from e
    model.pretrained_cfg = {k: v for k, v in cfg.items() if k != "state_dict"}
    return model


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether a TCP connection to the hub's host opens within `timeout` seconds (nothing is
    sent). Without it, timm's fetch through huggingface_hub retries an unreachable hub for
    about 50 s (five retries for model.safetensors, five for pytorch_model.bin)."""
    url = urllib.parse.urlsplit(huggingface_hub.constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------------------------
# Out


def timm_args(model: VisionTransformer) -> tuple[str, dict]:
    """(timm architecture name, keyword arguments) with which `timm.create_model` builds a
    model with `model`'s parameter names and shapes."""
    for flag, what in (("shifted_patches", "tokenizes with shifted patches"),
                       ("locality_attention", "has locality self-attention")):
        if getattr(model, flag):
            raise ValueError(f"this model {what} ({flag}=True), which timm's ViT does not have: it "
                             "cannot be exported to timm")
    arch = model.preset if model.preset and timm.is_model(model.preset) else _TIMM_GENERIC_VIT
    kwargs = dict(model.config)
    if kwargs["init_values"] is not None and not kwargs["init_values"]:
        # layer scale starting at 0: timm builds none for a falsy init_values, and the value
        # only seeds gamma, which the weights overwrite
        kwargs["init_values"] = 1e-5
    return arch, kwargs


def export_timm(
    checkpoint: VisionTransformer | str | os.PathLike,
    out: str | os.PathLike,
    model_name: str | None = None,
) -> dict:
    """Write a vitflash model or checkpoint as a timm-loadable .safetensors file.

    Args:
        checkpoint: a VisionTransformer, or a checkpoint file (vitflash/timm state dict or
            Lightning checkpoint; see `read_checkpoint`).
        out: the .safetensors file to write.
        model_name: the preset the checkpoint was made from; read from a Lightning
            checkpoint's hyper_parameters["model_name"] when not given. Only num_heads is
            taken from it: everything else comes from the weights.
    Returns:
        the keyword arguments of `timm.create_model` that load the file, e.g.
        `timm.create_model(**export_timm(ckpt, out))`. `pretrained_cfg_overlay` carries the
        file and its num_classes (without it timm would drop a head of another size), and for a
        checkpoint of scripts/train.py the eval transform it was trained with (mean, std,
        crop_pct, interpolation), so that timm's `resolve_data_config` and `create_transform`
        prepare images as vitflash's evaluation did, not as the timm architecture's default.
    """
    inputs = None
    if isinstance(checkpoint, VisionTransformer):
        model = checkpoint
    else:
        source = str(checkpoint)
        obj = load_file(checkpoint)
        inputs = obj.get(INPUTS_KEY) if isinstance(obj, Mapping) else None
        state_dict, hparams = checkpoint_weights(obj, checkpoint)
        _check_is_vit(state_dict, source)
        recorded = hparams.get("model_name")
        if model_name and recorded and model_name != recorded:
            # the preset gives num_heads, which the weights do not show: another's would export
            # a model that computes something else
            raise ValueError(f"checkpoint {source} holds a {recorded} model (its hyper-parameters say so), not "
                             f"{model_name}: leave model_name= (--model) out, or pass {recorded}")
        name = model_name or recorded
        if name is None:
            raise ValueError(
                f"checkpoint {source} does not say which model it holds (no "
                f"hyper_parameters['model_name']): pass model_name= (--model), one of "
                f"{', '.join(list_models())}"
            )
        arch = architecture_of(state_dict)
        shape = ("patch_size", "in_chans", "embed_dim", "depth", "mlp_ratio", "img_size")
        kwargs = {**{k: arch[k] for k in shape if k in arch}, **_arguments_of(arch, hparams, name)}
        try:
            model = build_model(name, **kwargs)
        except ValueError as e:
            raise ValueError(f"the preset {name} does not fit the weights of {source} ({e}): pass the preset "
                             f"the checkpoint was made from as model_name= (--model)") from e
        _load(model, _state_dict_cfg(state_dict, arch, model), source=source)
    arch_name, kwargs = timm_args(model)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    metadata = {"format": "pt", "vitflash_model": model.preset or "", "timm_model": arch_name,
                "timm_kwargs": json.dumps(kwargs)}  # fmt: skip
    # safetensors' save_file writes through a private temporary file and keeps its mode
    # (0600); a plain write creates the file as any other, with the user's umask.
    out.write_bytes(safetensors.torch.save(tensors, metadata=metadata))
    c = model.config
    # Some timm default tags point at .npz files read by a custom loader (custom_load); the
    # overlay must switch it off, or timm would read the .safetensors file as an .npz.
    overlay = dict(file=str(out.resolve()), custom_load=False, num_classes=c["num_classes"],
                   input_size=(c["in_chans"], c["img_size"], c["img_size"]))  # fmt: skip
    if inputs is not None:
        overlay.update(mean=tuple(inputs["mean"]), std=tuple(inputs["std"]), crop_pct=inputs["crop_pct"],
                       interpolation=inputs["interpolation"])
    return dict(model_name=arch_name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
