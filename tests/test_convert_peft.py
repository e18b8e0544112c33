"""PEFT adapter directories through `uckpt convert` (issue 30): a LoRA adapter of a tiny
transformers model (built from a config, nothing downloaded), saved by PeftModel.save_pretrained
as safetensors and as .bin, converted to uckpt and back to a directory that
PeftModel.from_pretrained loads with the same weights bit for bit and the same outputs."""
import json
import os

import pytest

os.environ.setdefault("USE_TF", "0")  # transformers would import TensorFlow otherwise
os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from convert_common import assert_error, assert_ok, cli  # noqa: E402
from uckpt.conversion import convert, diff  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning",
                                        "ignore::UserWarning", "ignore::FutureWarning")


def base_model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg).eval()


def adapter(tmp_path, safe):
    """A LoRA adapter with random (not zero) B, saved by PEFT itself."""
    model = peft.get_peft_model(base_model(), peft.LoraConfig(
        r=4, target_modules=["c_attn"], init_lora_weights=False)).eval()
    src = tmp_path / "adapter"
    model.save_pretrained(src, safe_serialization=safe)
    return model, src


def loaded(directory):
    return peft.PeftModel.from_pretrained(base_model(), directory).eval()


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_adapter_directory_round_trip_loads_in_peft(tmp_path, safe):
    """adapter dir -> uckpt -> adapter dir: PeftModel.from_pretrained loads the same tensors
    bit for bit and gives the same outputs; adapter_config.json and README.md come back byte
    for byte; diff sees the directory and its conversion as identical."""
    model, src = adapter(tmp_path, safe)
    weights = "adapter_model.safetensors" if safe else "adapter_model.bin"
    assert convert(src, tmp_path / "ck").src_format == "hf"
    assert diff(src, tmp_path / "ck").identical
    back = tmp_path / "back"
    convert(tmp_path / "ck", back, dst_format="hf", hf_weights="safetensors" if safe else "pickle")
    assert sorted(p.name for p in back.iterdir()) == sorted(p.name for p in src.iterdir())
    for name in ("adapter_config.json", "README.md"):
        assert (back / name).read_bytes() == (src / name).read_bytes()
    assert diff(src / weights, back / weights).identical
    got = loaded(back)
    want = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    have = {k: v for k, v in got.state_dict().items() if "lora_" in k}
    assert list(want) == list(have) and want
    for k in want:
        assert torch.equal(want[k], have[k]), k
    ids = torch.arange(12).reshape(2, 6) % 96
    with torch.no_grad():
        assert torch.equal(model(ids).logits, got(ids).logits)


def test_adapter_cli_inspect_verify_and_refusals(tmp_path):
    """`uckpt inspect`, `verify` and `convert` take the adapter directory; an adapter is not
    cut into shards (PEFT reads one file): refused, naming the option to leave out."""
    model, src = adapter(tmp_path, True)
    proc = cli("inspect", src, "--json")
    assert_ok(proc)
    doc = json.loads(proc.stdout)
    assert doc["format"] == "hf" and "hf.files" in doc["kept"]
    assert any(leaf["path"].endswith("lora_A.weight") for leaf in doc["leaves"])
    proc = cli("verify", src)
    assert_ok(proc)
    assert proc.stdout.startswith("OK: hf:")
    assert_ok(cli("convert", src, tmp_path / "ck"))
    assert_error(cli("convert", tmp_path / "ck", tmp_path / "sharded", "--to", "hf",
                     "--max-shard-size", "1KB"),
                 "PEFT adapter", "not from shards", "leave out --max-shard-size")
    assert not (tmp_path / "sharded").exists()
