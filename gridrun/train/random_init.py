"""`model.init=random`: a model family's real architecture with random weights, no hub needed.

The architecture comes from the published numbers in gridrun/arch/ (layers, widths, heads,
vocabulary, tied embeddings, rope, sliding-window layout) and is built with the family's
transformers class (Qwen3, Qwen2, Llama, Gemma3ForCausalLM, Phi3). Weights are drawn with
transformers' own initialiser from a fixed seed, on the device that will train them, so every
cell of a sweep starts from the same base model and a 4B model never has to pass through host
memory. The model's generation_config carries the published end-of-turn ids.

The tokenizer is the toy world's byte-level BPE (it encodes any text, byte by byte where it
has no merge) mapped into the family's vocabulary. For Qwen3 its ordinary tokens keep their
ids (all below 400) and its special tokens move to Qwen3's own ids (<|endoftext|> 151643,
<|im_start|> 151644, <|im_end|> 151645, <think> 151667, </think> 151668), with the toy world's
template (Qwen3's shape with thinking disabled: `<|im_start|>assistant\n<think>\n\n</think>\n\n`).
Another family's tokenizer has that family's special tokens at their published ids (its
ordinary tokens moved past them where they would collide: Gemma's <start_of_turn> is 105)
and the family's turn format (gridrun/arch/families.py), so stop tokens, padding and the
template's refusals behave as with the real tokenizer. Ids the tokenizer does not know
decode to nothing; a random model samples them freely, which is what a
shape/memory/speed check wants: every response runs to its length limit.

Not here: real weights (model.init=pretrained), vLLM (it loads weights from disk; use
engine=hf with random init, or save the built model first).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from gridrun.arch import QWEN3_SPECIAL_IDS, config_kwargs, families, family, published, shaped
from gridrun.train.seeds import INIT_SEED


def _cache_root() -> Path:
    return Path(os.environ.get("GRIDRUN_CACHE", Path.home() / ".cache" / "gridrun"))


def special_tokens(arch: dict[str, Any]) -> dict[str, Any]:
    """The family's special tokens: {special_ids: {content: id}, eos_token, pad_token, bos_token}."""
    return arch.get("tokenizer") or {"special_ids": QWEN3_SPECIAL_IDS, "eos_token": "<|im_end|>",
                                     "pad_token": "<|endoftext|>"}


def remap_tokenizer_json(toy: dict[str, Any], special_ids: dict[str, int] = QWEN3_SPECIAL_IDS) -> dict[str, Any]:
    """The toy tokenizer.json with the family's special tokens at their ids: the toy's own
    special tokens move there where the family has them (Qwen3: all five), the others are
    dropped, and the ordinary tokens shift past the special ids where they would collide."""
    remapped = json.loads(json.dumps(toy))
    vocab = remapped["model"]["vocab"]
    toy_special = {t["content"]: t["id"] for t in remapped["added_tokens"]}
    if set(toy_special) <= set(special_ids):
        for token in remapped["added_tokens"]:
            token["id"] = special_ids[token["content"]]
        for text in toy_special:
            vocab[text] = special_ids[text]
        return remapped
    template = remapped["added_tokens"][0]
    for text in toy_special:
        vocab.pop(text, None)
    ordinary = sorted(vocab.values())
    taken = [i for i in special_ids.values() if ordinary and ordinary[0] <= i <= ordinary[-1]]
    shift = max(taken) + 1 - ordinary[0] if taken else 0
    for text in vocab:
        vocab[text] += shift
    # In the model's vocabulary too: tokenizers gives an added token its vocabulary id.
    vocab.update(special_ids)
    remapped["added_tokens"] = [{**template, "id": i, "content": text} for text, i in sorted(special_ids.items(), key=lambda kv: kv[1])]
    return remapped


def tokenizer_dir(toy_dir: Path, name_or_path: str = "Qwen/Qwen3-1.7B") -> Path:
    """A cached directory holding the toy tokenizer mapped into the vocabulary of
    `name_or_path`'s family, with that family's turn format."""
    arch = published(name_or_path)
    tokens = special_tokens(arch)
    fam = families.family_of(name_or_path)
    turn_format = fam.turn_format if fam else None
    toy_json = (toy_dir / "tokenizer.json").read_text()
    if turn_format is None:
        # Qwen3's key as before this module knew other families: cached folders stay valid.
        key_text = toy_json + json.dumps(QWEN3_SPECIAL_IDS, sort_keys=True)
        folder = "qwen3-vocab-tokenizer"
    else:
        key_text = toy_json + json.dumps(tokens, sort_keys=True) + turn_format
        folder = f"{family(arch)}-vocab-tokenizer"
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    target = _cache_root() / folder / key
    if (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "tokenizer.json").exists():
            return target
        staging = target.with_name(f".{key}.{os.getpid()}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        if turn_format is None:
            for name in ("tokenizer_config.json", "chat_template.jinja"):
                shutil.copy(toy_dir / name, staging / name)
        else:
            toy_config = json.loads((toy_dir / "tokenizer_config.json").read_text())
            named = {k: tokens[k] for k in ("eos_token", "pad_token", "bos_token") if tokens.get(k)}
            toy_config = {k: v for k, v in toy_config.items() if k not in ("eos_token", "pad_token")}
            (staging / "tokenizer_config.json").write_text(json.dumps({**toy_config, **named}, indent=2))
            (staging / "chat_template.jinja").write_text(turn_format)
        remapped = remap_tokenizer_json(json.loads(toy_json), tokens["special_ids"])
        (staging / "tokenizer.json").write_text(json.dumps(remapped))
        os.replace(staging, target)
    return target


def load_random(name_or_path: str, dtype: torch.dtype, device: torch.device, toy_dir: Path,
                arch_overrides: dict[str, int] | None = None) -> tuple[Any, Any]:
    """(randomly initialised model of the published architecture, its sizes replaced by
    `arch_overrides`, tokenizer in its family's vocabulary)."""
    arch = shaped(name_or_path, dict(arch_overrides or {}))
    config = AutoConfig.for_model(arch["model_type"], **config_kwargs(arch))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(toy_dir, name_or_path), padding_side="left")
    # The caller's RNG streams are left as they were: seeding the init must not reseed training.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        # Fixed whatever the cell's seed, so a base cell and a training cell's step 0 agree.
        torch.manual_seed(INIT_SEED)
        # Built on its device in its dtype: a 4B model never exists in float32 on the host.
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # generation_config.json's end-of-turn ids (Gemma's <end_of_turn>, Phi's <|end|>), as a
    # fetched checkpoint has them.
    for key, value in arch.get("generation_config", {}).items():
        setattr(model.generation_config, key, value)
    return model, tokenizer
