"""`model.init=random`: the real Qwen3 architecture with random weights, no hub needed.

The architecture comes from the published numbers in gridrun/arch/ (layers, widths, heads,
vocab 151,936, tied embeddings, rope theta). Weights are drawn with transformers' own
initialiser (normal, std 0.02) from a fixed seed, on the device that will train them, so
every cell of a sweep starts from the same base model and a 4B model never has to pass
through host memory.

The tokenizer is the toy world's byte-level BPE (it encodes any text, byte by byte where
it has no merge) mapped into Qwen3's vocabulary: its ordinary tokens keep their ids (all
below 400), and its special tokens move to Qwen3's own ids (<|endoftext|> 151643,
<|im_start|> 151644, <|im_end|> 151645, <think> 151667, </think> 151668), so stop tokens,
padding and the chat template (Qwen3's shape with thinking disabled:
`<|im_start|>assistant\n<think>\n\n</think>\n\n`) behave as with the real tokenizer. Ids
the tokenizer does not know decode to nothing; a random model samples them freely, which
is what a shape/memory/speed check wants: every response runs to its length limit.

Not here: real weights (model.init=pretrained), vLLM (it loads weights from disk; use
engine=hf with random init).
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
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from gridrun.arch import QWEN3_SPECIAL_IDS, shaped
from gridrun.train.seeds import INIT_SEED


def _cache_root() -> Path:
    return Path(os.environ.get("GRIDRUN_CACHE", Path.home() / ".cache" / "gridrun"))


def remap_tokenizer_json(toy: dict[str, Any]) -> dict[str, Any]:
    """The toy tokenizer.json with its special tokens moved to Qwen3's ids."""
    remapped = json.loads(json.dumps(toy))
    moved = {}
    for token in remapped["added_tokens"]:
        if token["content"] not in QWEN3_SPECIAL_IDS:
            raise ValueError(f"toy special token {token['content']!r} has no Qwen3 id")
        moved[token["id"]] = QWEN3_SPECIAL_IDS[token["content"]]
        token["id"] = QWEN3_SPECIAL_IDS[token["content"]]
    vocab = remapped["model"]["vocab"]
    for text, old in list(vocab.items()):
        if old in moved:
            vocab[text] = moved[old]
    return remapped


def tokenizer_dir(toy_dir: Path) -> Path:
    """A cached directory holding the toy tokenizer mapped into Qwen3's vocabulary."""
    toy_json = (toy_dir / "tokenizer.json").read_text()
    key = hashlib.sha256((toy_json + json.dumps(QWEN3_SPECIAL_IDS, sort_keys=True)).encode()).hexdigest()[:16]
    target = _cache_root() / "qwen3-vocab-tokenizer" / key
    if (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "tokenizer.json").exists():
            return target
        staging = target.with_name(f".{key}.{os.getpid()}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for name in ("tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(toy_dir / name, staging / name)
        (staging / "tokenizer.json").write_text(json.dumps(remap_tokenizer_json(json.loads(toy_json))))
        os.replace(staging, target)
    return target


def load_random(name_or_path: str, dtype: torch.dtype, device: torch.device, toy_dir: Path,
                arch_overrides: dict[str, int] | None = None) -> tuple[Any, Any]:
    """(randomly initialised Qwen3 of the published architecture, its sizes replaced by
    `arch_overrides`, Qwen3-vocabulary tokenizer)."""
    arch = shaped(name_or_path, dict(arch_overrides or {}))
    config = Qwen3Config(**{k: v for k, v in arch.items() if k not in ("architectures", "model_type")})
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(toy_dir), padding_side="left")
    # The caller's RNG streams are left as they were: seeding the init must not reseed training.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        # Fixed whatever the cell's seed, so a base cell and a training cell's step 0 agree.
        torch.manual_seed(INIT_SEED)
        # Built on its device in its dtype: a 4B model never exists in float32 on the host.
        with torch.device(device):
            model = Qwen3ForCausalLM._from_config(config, dtype=dtype)
    return model, tokenizer
