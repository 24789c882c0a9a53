"""Where each vLLM engine compiles: `vllm_cache_root`. Apart from vllm.py so that it is
tested where vLLM is not installed."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def vllm_cache_root(env: Mapping[str, str], gpu: str) -> str:
    """vLLM's cache root (VLLM_CACHE_ROOT) for an engine on the GPU of UUID `gpu`: a folder
    per GPU under the root vLLM would take (VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm or
    ~/.cache/vllm, as vllm/envs.py). vLLM compiles every engine of a tensor-parallel size of 1
    into the same `<root>/torch_compile_cache/<hash>/rank_0_0` (its AOT compile into
    `<root>/torch_aot_compile/<hash>`, whatever compilation_config.cache_dir says), so the two
    ranks of a node, and two nodes under one shared home, would write the same folder at once;
    one GPU holds one engine at a time, and the same GPU finds its compilation again in a later
    job. Set again with the same `gpu`, the root is kept."""
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".cache"), "vllm")
    root = os.path.expanduser(root)
    return root if Path(root).name == gpu else os.path.join(root, gpu)
