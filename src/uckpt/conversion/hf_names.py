"""The file names of a Hugging Face directory (a PEFT adapter's too), apart from reading and
writing it (:mod:`.hf`), so that format detection can recognise one without importing the
reader."""
from __future__ import annotations

from pathlib import Path

#: weights kind -> (single file, index file, shard name pattern)
WEIGHTS = {"safetensors": ("model.safetensors", "model.safetensors.index.json",
                           "model-{:05d}-of-{:05d}.safetensors"),
           "pickle": ("pytorch_model.bin", "pytorch_model.bin.index.json",
                      "pytorch_model-{:05d}-of-{:05d}.bin")}


#: a PEFT adapter directory (``PeftModel.save_pretrained``): its config, and its weights as
#: one file of either kind (PEFT reads the safetensors one first; it writes no shards)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = {"safetensors": "adapter_model.safetensors", "pickle": "adapter_model.bin"}


def is_hf_directory(path: Path) -> bool:
    names = [n for single, index, _ in WEIGHTS.values() for n in (single, index)]
    names += list(ADAPTER_WEIGHTS.values())
    return any((path / n).is_file() for n in names + ["trainer_state.json"])
