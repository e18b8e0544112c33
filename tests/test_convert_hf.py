"""Hugging Face layouts through `uckpt convert` (issue 14): transformers models built from tiny
configs (random weights, nothing downloaded) saved with save_pretrained, sharded and not, as
safetensors and .bin, converted to every format and back; from_pretrained loads each result
bit for bit. A Trainer checkpoint-N directory (written as the Trainer writes it) keeps its
optimizer, scheduler, RNG states and carried files."""
import json
import os
import random

import numpy as np
import pytest

os.environ.setdefault("USE_TF", "0")  # transformers would import TensorFlow otherwise
os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from convert_common import assert_error, assert_ok, cli  # noqa: E402
from uckpt.conversion import UnknownFormatError, convert, diff, open_checkpoint  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning",
                                        "ignore::UserWarning", "ignore::FutureWarning")
MIDDLES = {"uckpt": "mid", "npz": "mid.npz", "hdf5": "mid.h5", "pickle": "mid.pt",
           "safetensors": "mid.safetensors"}
SHARD = "24KB"


def gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg)


def bert():  # BertForMaskedLM ties its decoder to the word embeddings
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=96, max_position_embeddings=64)
    return transformers.BertForMaskedLM(cfg)


def llama(dtype=None):
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=64, vocab_size=96,
                                   max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg)
    return model.to(dtype) if dtype is not None else model


BUILDERS = {"gpt2": gpt2, "bert": bert, "llama": llama,
            "llama-bf16": lambda: llama(torch.bfloat16)}


def saved(tmp_path, name, weights, shard):
    torch.manual_seed(0)
    model = BUILDERS[name]()
    src = tmp_path / "src"
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(src, safe_serialization=weights == "safetensors", **kw)
    return model, src


def assert_loads_same(model, directory):
    back = type(model).from_pretrained(directory, torch_dtype=model.dtype)
    want, got = model.state_dict(), back.state_dict()
    assert list(want) == list(got)
    for k in want:
        assert want[k].dtype == got[k].dtype, k
        assert torch.equal(want[k].view(torch.uint8) if want[k].dtype == torch.bfloat16 else
                           want[k], got[k].view(torch.uint8) if got[k].dtype == torch.bfloat16
                           else got[k]), k


def _case(name, weights, shard, slow=True):
    marks = [pytest.mark.slow] if slow else []
    return pytest.param(name, weights, shard, marks=marks,
                        id=f"{name}-{weights}-{'sharded' if shard else 'single'}")


CASES = [_case("gpt2", "safetensors", SHARD, slow=False),
         _case("bert", "bin", None, slow=False),
         _case("llama-bf16", "bin", SHARD, slow=False),
         _case("llama", "safetensors", None, slow=False)]
CASES += [_case(n, w, s) for n in BUILDERS for w in ("safetensors", "bin") for s in (None, SHARD)
          if (n, w, s) not in {(c.values[0], c.values[1], c.values[2]) for c in CASES}]


@pytest.mark.parametrize("name,weights,shard", CASES)
def test_save_pretrained_through_every_format(tmp_path, name, weights, shard):
    """save_pretrained -> uckpt, NPZ, HDF5, torch.save, safetensors -> a Hugging Face
    directory (single file, and shards of the other kind): from_pretrained loads the same
    tensors bit for bit, the config comes along, and the safetensors files say format pt."""
    from safetensors import safe_open

    model, src = saved(tmp_path, name, weights, shard)
    index = "model.safetensors.index.json" if weights == "safetensors" else \
        "pytorch_model.bin.index.json"
    for fmt, mid_name in MIDDLES.items():
        mid = tmp_path / mid_name
        assert convert(src, mid).dst_format == fmt
        assert diff(src, mid).identical, fmt
        back = tmp_path / f"back-{fmt}"
        convert(mid, back, dst_format="hf")
        assert (back / "config.json").read_bytes() == (src / "config.json").read_bytes()
        first = "model.safetensors"
        if shard:  # cut as the source was: its index's metadata kept
            doc = json.loads((back / "model.safetensors.index.json").read_text())
            assert doc["metadata"] == json.loads((src / index).read_text())["metadata"]
            first = sorted(set(doc["weight_map"].values()))[0]
        with safe_open(back / first, "np") as f:
            assert f.metadata()["format"] == "pt"
        assert_loads_same(model, back)
        if fmt == "safetensors":
            with safe_open(mid, "np") as f:
                assert f.metadata()["format"] == "pt"
    other = "safetensors" if weights == "bin" else "pickle"
    resharded = tmp_path / "resharded"
    convert(tmp_path / "mid", resharded, dst_format=other, max_shard_size="16KB")
    index = "model.safetensors.index.json" if other == "safetensors" else \
        "pytorch_model.bin.index.json"
    doc = json.loads((resharded / index).read_text())
    assert len(set(doc["weight_map"].values())) > 1
    assert_loads_same(model, resharded)


def test_index_file_and_clear_errors(tmp_path):
    """An index file converts as its directory's weights; --from safetensors on it says what
    it is; an index naming a shard that lacks a tensor is refused by name."""
    model, src = saved(tmp_path, "gpt2", "safetensors", SHARD)
    index = src / "model.safetensors.index.json"
    convert(index, tmp_path / "w.safetensors")
    assert diff(src, tmp_path / "w.safetensors").identical
    with pytest.raises(UnknownFormatError, match="JSON document, not a safetensors file"):
        convert(index, tmp_path / "x.npz", src_format="safetensors")
    proc = cli("convert", "--from", "safetensors", index, tmp_path / "y.npz")
    assert_error(proc, "--from hf")
    assert "8387229874382703227" not in proc.stderr
    doc = json.loads(index.read_text())
    first = next(iter(doc["weight_map"]))
    doc["weight_map"]["not.there"] = doc["weight_map"][first]
    index.write_text(json.dumps(doc))
    with pytest.raises(Exception, match="not.there"):
        convert(src, tmp_path / "z.npz")


def test_trainer_checkpoint_directory(tmp_path):
    """A checkpoint-N directory as transformers' Trainer writes it (weights, optimizer.pt,
    scheduler.pt, rng_state.pth with NumPy's RNG state inside the pickle, trainer_state.json,
    training_args.bin) -> uckpt -> a Hugging Face directory again: every file loads with
    torch.load and equals the original; from_pretrained loads the weights."""
    torch.manual_seed(0)
    model = gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    loss = model(torch.randint(0, 96, (2, 8)), labels=torch.randint(0, 96, (2, 8))).loss
    loss.backward()
    opt.step()
    sched.step()
    ck = tmp_path / "checkpoint-1"
    model.save_pretrained(ck)
    torch.save(opt.state_dict(), ck / "optimizer.pt")
    torch.save(sched.state_dict(), ck / "scheduler.pt")
    random.seed(3)
    np.random.seed(3)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(),
                "cpu": torch.random.get_rng_state()}, ck / "rng_state.pth")
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 1, "log_history": []},
                                                      indent=2))
    (ck / "training_args.bin").write_bytes(b"\x80\x04not unpickled by uckpt\x00\xff")

    convert(ck, tmp_path / "u")
    with open_checkpoint(tmp_path / "u") as tree:
        assert set(tree.root) == {"model", "optimizer", "scheduler", "rng_state"}
        assert tree.root["rng_state"]["numpy"][1].dtype == "uint32"
    back = tmp_path / "back"
    convert(tmp_path / "u", back, dst_format="hf")
    for name in ("trainer_state.json", "training_args.bin", "config.json"):
        assert (back / name).read_bytes() == (ck / name).read_bytes(), name
    a, b = (torch.load(d / "optimizer.pt", weights_only=True) for d in (ck, back))
    assert a["param_groups"] == b["param_groups"]
    for i in a["state"]:
        for k, v in a["state"][i].items():
            assert torch.equal(v, b["state"][i][k])
    assert torch.load(back / "scheduler.pt", weights_only=True) == \
        torch.load(ck / "scheduler.pt", weights_only=True)
    rng_a = torch.load(ck / "rng_state.pth", weights_only=False)
    rng_b = torch.load(back / "rng_state.pth")  # as the Trainer loads it: weights_only
    assert rng_a["python"] == rng_b["python"]
    assert torch.equal(rng_a["cpu"], rng_b["cpu"])
    assert rng_a["numpy"][0] == rng_b["numpy"][0]
    assert np.array_equal(rng_a["numpy"][1], np.asarray(rng_b["numpy"][1]))
    np.random.set_state(rng_b["numpy"])  # the Trainer's own call: the array is a tensor now
    assert np.array_equal(np.random.get_state()[1], rng_a["numpy"][1])
    assert_loads_same(model, back)
    # a part of it: the weights alone, under the names from_pretrained takes
    convert(tmp_path / "u", tmp_path / "w.safetensors", select="model")
    assert diff(ck / "model.safetensors", tmp_path / "w.safetensors").identical


def test_cli_shards_inspect_verify(tmp_path):
    """`python -m uckpt` runs the same command: sharded output, inspect and verify of a
    Hugging Face directory, and a prefix added for a wrapped model."""
    model, src = saved(tmp_path, "bert", "safetensors", None)
    out = tmp_path / "out"
    assert_ok(cli("convert", src, out, "--to", "hf", "--max-shard-size", "20KB",
                  "--hf-weights", "pickle"))
    assert (out / "pytorch_model.bin.index.json").is_file()
    assert_loads_same(model, out)
    proc = cli("inspect", out, "--json")
    assert_ok(proc)
    doc = json.loads(proc.stdout)
    assert doc["format"] == "hf" and "hf.files" in doc["kept"]
    assert any(leaf["path"] == "bert.embeddings.word_embeddings.weight"
               for leaf in doc["leaves"])
    proc = cli("verify", out)
    assert_ok(proc)
    assert proc.stdout.startswith("OK: hf:")
    assert_ok(cli("convert", src, tmp_path / "p.safetensors", "--strip-prefix", "bert.",
                  "--add-prefix", "encoder."))
    with open_checkpoint(tmp_path / "p.safetensors") as tree:
        assert "encoder.embeddings.word_embeddings.weight" in tree.root
        assert "encoder.cls.predictions.bias" in tree.root  # kept, not stripped


def test_checkpoint_of_live_objects_to_from_pretrained(tmp_path):
    """uckpt.save of a live model and optimizer -> model.safetensors (--select model) and a
    Hugging Face directory: from_pretrained loads the weights bit for bit (tied BERT
    weights included)."""
    import uckpt

    torch.manual_seed(0)
    model = bert()
    opt = torch.optim.AdamW(model.parameters())
    uckpt.save(tmp_path / "ck", {"model": model, "optimizer": opt})
    export = tmp_path / "export"
    export.mkdir()
    model.config.save_pretrained(export)
    convert(tmp_path / "ck", export / "model.safetensors", select="model")
    assert_loads_same(model, export)
    convert(tmp_path / "ck", tmp_path / "hf", dst_format="hf", max_shard_size="30KB")
    (tmp_path / "hf" / "config.json").write_bytes((export / "config.json").read_bytes())
    assert (tmp_path / "hf" / "optimizer.pt").is_file()
    assert_loads_same(model, tmp_path / "hf")


def test_cache_snapshot_of_links(tmp_path):
    """A Hugging Face cache snapshot (every file a link to a blob) reads like its files;
    a shard the index names outside the directory is refused."""
    model, src = saved(tmp_path, "gpt2", "safetensors", SHARD)
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        f.rename(blobs / f.name)
        (snap / f.name).symlink_to(blobs / f.name)
    convert(snap, tmp_path / "back", dst_format="hf")
    assert (tmp_path / "back" / "config.json").read_bytes() == \
        (blobs / "config.json").read_bytes()
    assert_loads_same(model, tmp_path / "back")
    index = blobs / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"][next(iter(doc["weight_map"]))] = "../blobs/model.safetensors"
    index.write_text(json.dumps(doc))
    with pytest.raises(Exception, match="not a file name in its directory"):
        convert(snap, tmp_path / "x.npz")


def test_sharded_source_keeps_its_index_metadata_without_max_shard_size(tmp_path):
    """A sharded save_pretrained directory -> uckpt -> --to hf without --max-shard-size: cut
    into shards no larger than the source's, so the index comes back with its metadata
    (total_parameters, which transformers writes and uckpt does not compute); the weights
    load bit for bit."""
    model, src = saved(tmp_path, "gpt2", "safetensors", SHARD)
    meta = json.loads((src / "model.safetensors.index.json").read_text())["metadata"]
    assert "total_parameters" in meta
    convert(src, tmp_path / "ck")
    assert_ok(cli("convert", tmp_path / "ck", tmp_path / "back", "--to", "hf"))
    doc = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())
    assert doc["metadata"] == meta
    largest = max((src / f).stat().st_size for f in set(doc["weight_map"].values()))
    assert all((tmp_path / "back" / f).stat().st_size <= largest
               for f in set(doc["weight_map"].values()))
    assert_loads_same(model, tmp_path / "back")


def test_extra_top_level_keys_to_hf(tmp_path):
    """--to hf of a checkpoint with keys beside model (the README's state(step) recipe): plain
    values (step, epoch) are left out with a warning naming them and the weights written;
    a key holding arrays (rng) is refused by name with the --select that writes the rest,
    never an internal class name; that --select then writes weights and optimizer.pt."""
    import uckpt

    torch.manual_seed(0)
    model = gpt2()
    opt = torch.optim.AdamW(model.parameters())
    uckpt.save(tmp_path / "plain", {"model": model, "step": 5, "epoch": 1})
    back = tmp_path / "back"
    report = convert(tmp_path / "plain", back, dst_format="hf")
    assert any("'step', 'epoch'" in w and "not written" in w for w in report.warnings)
    model.config.save_pretrained(back)
    assert_loads_same(model, back)
    uckpt.save(tmp_path / "state", {"model": model, "optimizer": opt,
                                    "rng": uckpt.RandomState(), "step": 5})
    proc = cli("convert", tmp_path / "state", tmp_path / "x", "--to", "hf")
    assert_error(proc, "'rng' beside them holds", "--select model --select optimizer")
    assert "Obj" not in proc.stderr and "'model' holds" not in proc.stderr
    assert_ok(cli("convert", tmp_path / "state", tmp_path / "y", "--to", "hf",
                  "--select", "model", "--select", "optimizer"))
    assert (tmp_path / "y" / "optimizer.pt").is_file()
    model.config.save_pretrained(tmp_path / "y")
    assert_loads_same(model, tmp_path / "y")


def test_diff_of_dcp_and_its_hf_output(tmp_path):
    """A DCP {"model": sd} and its --to hf output compare identical: diff takes the weights
    as --to hf takes them (the model level), both ways round."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = gpt2()
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "dcp"))
    convert(tmp_path / "dcp", tmp_path / "hf", dst_format="hf")
    for a, b in ((tmp_path / "dcp", tmp_path / "hf"), (tmp_path / "hf", tmp_path / "dcp")):
        report = diff(a, b)
        assert report.identical, report.differences[:3]
        assert report.compared == len(model.state_dict())
    proc = cli("diff", tmp_path / "dcp", tmp_path / "hf")
    assert_ok(proc)
