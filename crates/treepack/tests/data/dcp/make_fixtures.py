"""Writes the torch.distributed.checkpoint (DCP) fixtures of crates/treepack/tests/dcp.rs (issue 54):
folders written by real `torch.distributed.checkpoint.save`, the values they hold
(`expected.json`), and the hostile corpus (`hostile/<case>/`, listed with the error each must get
in `hostile/EXPECTED.tsv`). Run from the repository root with a Python that has torch:

    .venv/bin/python crates/treepack/tests/data/dcp/make_fixtures.py

Tensors are seeded; DCP itself writes a fresh `save_id` each time, so the `.metadata` files
change with every run (the values do not).
"""

import io
import json
import os
import pickle
import shutil
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import SerializationFormat, _StorageInfo
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, TensorProperties, TensorStorageMetadata)

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
HOSTILE = os.path.join(HERE, "hostile")


def tensor_expect(t):
    """dtype, shape and the C-order little-endian bytes (hex) of a tensor."""
    c = t.detach().contiguous()
    raw = c.view(torch.int16) if c.dtype == torch.bfloat16 else c
    return {"tensor": {"dtype": str(c.dtype).replace("torch.", ""), "shape": list(c.shape),
                       "hex": raw.numpy().tobytes().hex()}}


def value_expect(v):
    """A plain value as JSON (tuples as lists), as dcp.rs renders the tree read."""
    if isinstance(v, torch.Tensor):
        return tensor_expect(v)
    if isinstance(v, (list, tuple)):
        return [value_expect(x) for x in v]
    if isinstance(v, dict):
        return {str(k): value_expect(x) for k, x in v.items()}
    return v


def flat(sd):
    """The state_dict as DCP flattens it: fqn -> value."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    return flatten_state_dict(sd)[0]


def fresh(name):
    path = os.path.join(HERE, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


def save(name, sd):
    path = fresh(name)
    # A relative checkpoint_id, so the metadata names no absolute path of this machine.
    cwd = os.getcwd()
    os.chdir(HERE)
    try:
        dcp.save(sd, checkpoint_id=name)
    finally:
        os.chdir(cwd)
    return path


def state():
    torch.manual_seed(0)
    base = torch.arange(12, dtype=torch.float32)
    sd = {
        "model": {
            "w": torch.randn(3, 4),
            "h": torch.tensor([0.5, -1.25, 65504.0], dtype=torch.float16),
            "bf": torch.tensor([1.0, -2.5, 3.140625], dtype=torch.bfloat16),
            "ids": torch.tensor([1, -2, 3_000_000_000], dtype=torch.int64),
            "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
            "mask": torch.tensor([True, False, True]),
            "c": torch.tensor([1 + 2j, -3.5j], dtype=torch.complex64),
            "d": torch.tensor([[1.0, 2.0]], dtype=torch.float64),
            "wt": torch.randn(2, 3).t(),  # a non-contiguous view
            "a": base[:6],  # a and b view one storage
            "b": base[6:].view(2, 3),
            "scalar": torch.tensor(3.5),
            "empty": torch.zeros(0, 3),
        },
        "step": 7,
        "name": "text",
        "lr": 0.1,
        "none": None,
        "flag": True,
        "tup": (1, "two", 3.0),
        "nested": {"list": [1, 2, 3], "deeper": {"x": -4}},
        "objs": [torch.ones(2), {"k": "v"}],  # a list: one torch.save'd object, tensor inside
    }
    save("state", sd)
    return {k: value_expect(v) for k, v in flat(sd).items()}


def optim():
    from torch.distributed.checkpoint.state_dict import get_state_dict
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    save("optim", sd)
    return {k: value_expect(v) for k, v in flat(sd).items()}


def _sharded_rank(rank, world, out):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    warnings.filterwarnings("ignore")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("DCP_FIXTURE_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    sd = {k: distribute_tensor(t, mesh, p) for k, (t, p) in _sharded_values(Shard, Replicate).items()}
    sd["step"] = 3
    cwd = os.getcwd()
    os.chdir(HERE)
    dcp.save(sd, checkpoint_id=out)
    os.chdir(cwd)
    dist.destroy_process_group()


def _sharded_values(Shard, Replicate):
    return {
        "rows": (torch.arange(15, dtype=torch.float32).reshape(5, 3), [Shard(0)]),  # 3 + 2 rows
        "cols": (torch.arange(24, dtype=torch.int32).reshape(4, 6), [Shard(1)]),  # column blocks
        "cube": (torch.arange(2 * 4 * 3, dtype=torch.float16).reshape(2, 4, 3), [Shard(1)]),
        "rep": (torch.ones(3), [Replicate()]),
        "one_row": (torch.arange(4, dtype=torch.int64).reshape(1, 4), [Shard(0)]),  # rank 1 holds none
    }


def sharded():
    """Two ranks of a gloo process group on this machine: DTensors sharded by rows and columns."""
    import torch.multiprocessing as mp
    from torch.distributed.tensor import Replicate, Shard
    fresh("sharded")
    mp.spawn(_sharded_rank, args=(2, "sharded"), nprocs=2)
    out = {k: tensor_expect(t) for k, (t, _) in _sharded_values(Shard, Replicate).items()}
    out["step"] = 3
    return out


# ---- The hostile corpus: each folder and the error it must get. ----

CASES = []  # (folder, kind, text the message must contain, what it is)


class Reduce:
    def __init__(self, f, args):
        self.f, self.args = f, args

    def __reduce__(self):
        return (self.f, self.args)


def props(dtype):
    return TensorProperties(dtype=dtype)


def build(name, entries, *, data_name="__0_0.distcp", mutate=None, kind, needle, what):
    """A DCP folder written by hand: `entries` is fqn -> ("tensor", dtype, size, [(offsets, tensor)])
    or ("bytes", object) or ("raw", bytes); each piece is torch.save'd (raw bytes as they are) into
    one data file, and the metadata made with DCP's own classes. `mutate(md, data)` may change
    the metadata and returns the data file's bytes (or the metadata's own bytes with
    ("metadata", bytes))."""
    path = os.path.join(HOSTILE, name)
    os.makedirs(path)
    data = io.BytesIO()
    sdm, storage = {}, {}
    for fqn, e in entries.items():
        if e[0] == "tensor":
            _, dtype, size, chunks = e
            cmeta = []
            for offsets, t in chunks:
                start = data.tell()
                torch.save(t, data)
                sizes = t.shape if isinstance(t, torch.Tensor) else size
                cmeta.append(ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes)))
                storage[MetadataIndex(fqn, offsets)] = _StorageInfo(data_name, start, data.tell() - start)
            sdm[fqn] = TensorStorageMetadata(properties=props(dtype), size=torch.Size(size), chunks=cmeta)
        else:
            start = data.tell()
            if e[0] == "bytes":
                torch.save(e[1], data)
            else:
                data.write(e[1])
            sdm[fqn] = BytesStorageMetadata()
            storage[MetadataIndex(fqn)] = _StorageInfo(data_name, start, data.tell() - start)
    md = Metadata(state_dict_metadata=sdm, storage_data=storage, version="1.0.0")
    blob = data.getvalue()
    meta = None
    if mutate is not None:
        got = mutate(md, blob)
        if isinstance(got, tuple) and got[0] == "metadata":
            meta = got[1]
        elif got is not None:
            blob = got
    with open(os.path.join(path, ".metadata"), "wb") as f:
        f.write(meta if meta is not None else pickle.dumps(md))
    with open(os.path.join(path, data_name), "wb") as f:
        f.write(blob)
    CASES.append((name, kind, needle, what))


def one(t):
    return ("tensor", t.dtype, list(t.shape), [([0] * t.dim(), t)])


def info_of(md, fqn):
    return next(v for k, v in md.storage_data.items() if k.fqn == fqn)


def hostile():
    shutil.rmtree(HOSTILE, ignore_errors=True)
    os.makedirs(HOSTILE)
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    good = {"w": one(w), "step": ("bytes", 5)}

    # Code in the metadata: refused by the metadata's own allow-list, nothing run.
    def evil_planner(md, data):
        md.planner_data = {"w": Reduce(os.system, ("touch /tmp/treepack-pwned",))}
    build("metadata-os-system", good, mutate=evil_planner, kind="pickle/refused", needle="posix.system",
          what="__reduce__ to os.system in planner_data")

    def evil_entry(md, data):
        md.state_dict_metadata["x"] = Reduce(os.system, ("touch /tmp/treepack-pwned",))
    build("metadata-entry-os-system", good, mutate=evil_entry, kind="pickle/refused", needle="posix.system",
          what="__reduce__ to os.system as an entry of state_dict_metadata")

    def torch_global(md, data):
        md.planner_data = {"w": torch.ones(1)}
    build("metadata-tensor", good, mutate=torch_global, kind="pickle/refused", needle="refused global `torch.",
          what="a tensor in the metadata: torch.save's allow-list is not the metadata's")
    # Code in an object's torch.save: refused by torch.save's allow-list.
    build("bytes-os-system", {"w": one(w), "obj": ("bytes", {"x": Reduce(os.system, ("touch /tmp/treepack-pwned",))})},
          kind="pickle/refused", needle="posix.system", what="__reduce__ to os.system inside a torch.save'd object")

    def many_fields(md, data):
        raw = pickle.dumps(md)
        at = raw.index(b"relative_path")
        # A state of 70 fields on the first _StorageInfo: not a DCP record.
        extra = b"".join(b"\x8c\x03f%02d" % i + b"K\x00" for i in range(70))
        return ("metadata", raw[:at - 2] + extra + raw[at - 2:])
    build("record-many-fields", good, mutate=many_fields, kind="pickle/bad_call", needle="more than 64 fields",
          what="a record whose state sets 70 fields")

    # Files outside the folder.
    def dotdot(md, data):
        info_of(md, "w").relative_path = "../secret.distcp"
    build("relative-dotdot", good, mutate=dotdot, kind="invalid_foreign", needle="../secret.distcp",
          what="relative_path ../secret.distcp")

    def absolute(md, data):
        info_of(md, "w").relative_path = "/etc/passwd"
    build("relative-absolute", good, mutate=absolute, kind="invalid_foreign", needle="/etc/passwd",
          what="relative_path /etc/passwd")

    def subdir(md, data):
        info_of(md, "w").relative_path = "sub/__0_0.distcp"
    build("relative-subdir", good, mutate=subdir, kind="invalid_foreign", needle="not a file of the checkpoint",
          what="relative_path in a sub-folder")

    def missing_file(md, data):
        info_of(md, "w").relative_path = "__9_0.distcp"
    build("missing-file", good, mutate=missing_file, kind="not_found", needle="__9_0.distcp",
          what="a data file that is not there")

    # Ranges that lie.
    def past_end(md, data):
        info_of(md, "w").length += 10_000
    build("range-past-end", good, mutate=past_end, kind="invalid_foreign", needle="past the end",
          what="a length past the end of the file")

    def huge_offset(md, data):
        info_of(md, "w").offset = 2**63 - 10
    build("range-huge-offset", good, mutate=huge_offset, kind="invalid_foreign", needle="past the end",
          what="an offset near 2^63")

    def overlap(md, data):
        s = info_of(md, "step")
        s.offset, s.length = 10, s.length
    build("range-overlap", good, mutate=overlap, kind="invalid_foreign", needle="overlap",
          what="two items whose bytes overlap")

    def shifted(md, data):
        info_of(md, "w").offset += 3
        info_of(md, "w").length -= 3
    build("range-shifted", good, mutate=shifted, kind="invalid_foreign", needle="not a torch.save zip",
          what="an offset that misses the chunk's zip")

    build("truncated-data", good, mutate=lambda md, data: data[: len(data) - 400], kind="invalid_foreign",
          needle="past the end", what="a data file cut short")

    build("truncated-metadata", good, mutate=lambda md, data: ("metadata", pickle.dumps(md)[:300]),
          kind="pickle/truncated", needle="truncated", what="a .metadata cut short")

    def no_storage(md, data):
        del md.storage_data[next(k for k in md.storage_data if k.fqn == "w")]
    build("missing-storage", good, mutate=no_storage, kind="invalid_foreign", needle="no storage_data entry",
          what="a tensor without a storage_data entry")

    # Chunks that do not tile their tensor.
    t4 = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    build("chunks-overlap", {"w": ("tensor", torch.float32, [4, 4], [([0, 0], t4[:3]), ([2, 0], t4[3:])])},
          kind="invalid_foreign", needle="overlaps", what="two chunks over one row (and a row left out)")
    build("chunks-gap", {"w": ("tensor", torch.float32, [4, 4], [([0, 0], t4[:2])])},
          kind="invalid_foreign", needle="cover 8 elements of its 16", what="chunks that leave a gap")
    build("chunk-outside", {"w": ("tensor", torch.float32, [4, 4], [([0, 0], t4[:2]), ([3, 0], t4[2:])])},
          kind="invalid_foreign", needle="reaches outside", what="a chunk past the tensor's end")
    build("chunk-rank", {"w": ("tensor", torch.float32, [16], [([0, 0], t4)])},
          kind="invalid_foreign", needle="dimensions", what="a chunk of another rank")
    build("chunk-dtype", {"w": ("tensor", torch.float64, [3, 4], [([0, 0], w)])},
          kind="invalid_foreign", needle="where the metadata says float64", what="a chunk of another dtype")

    def wrong_sizes(md, data):
        md.state_dict_metadata["w"].size = torch.Size([4, 3])
        md.state_dict_metadata["w"].chunks[0].sizes = torch.Size([4, 3])
    build("chunk-size", good, mutate=wrong_sizes, kind="invalid_foreign", needle="of size [3, 4]",
          what="a chunk whose saved tensor has another size")
    build("chunk-not-tensor", {"w": ("tensor", torch.float32, [2], [([0], {"not": "a tensor"})])},
          kind="invalid_foreign", needle="not a tensor", what="a chunk holding a dict")

    # Sizes that claim more than the files hold.
    def huge(md, data):
        md.state_dict_metadata["w"].size = torch.Size([2**40, 2**40])
        md.state_dict_metadata["w"].chunks[0].sizes = torch.Size([2**40, 2**40])
    build("size-overflow", good, mutate=huge, kind="invalid_foreign", needle="overflows 64 bits",
          what="a size whose bytes overflow 64 bits")

    def big(md, data):
        md.state_dict_metadata["w"].size = torch.Size([2**33])
        md.state_dict_metadata["w"].chunks[0] = ChunkStorageMetadata(offsets=torch.Size([0]),
                                                                     sizes=torch.Size([2**33]))
        k = next(k for k in md.storage_data if k.fqn == "w")
        md.storage_data[MetadataIndex("w", [0])] = md.storage_data.pop(k)
    build("size-huge", good, mutate=big, kind="invalid_foreign", needle="more than the",
          what="a 32 GiB tensor over a 1 KiB chunk")

    # What is not read: transforms, other serializations, other layouts.
    def zstd(md, data):
        info_of(md, "w").transform_descriptors = ["zstd/1"]
    build("transform-zstd", good, mutate=zstd, kind="invalid_foreign", needle="zstd/1",
          what="a chunk saved through DCP's zstd extension")

    def sparse(md, data):
        md.state_dict_metadata["w"].properties.layout = torch.sparse_coo
    build("layout-sparse", good, mutate=sparse, kind="pickle/bad_call", needle="torch.sparse_coo",
          what="a sparse layout")
    build("bytes-not-zip", {"w": one(w), "obj": ("raw", b"\x00" * 64)}, kind="invalid_foreign",
          needle="not a torch.save zip", what="an object's bytes that are not a torch.save zip")

    path = os.path.join(HOSTILE, "safetensors")
    os.chdir(HOSTILE)
    dcp.save({"w": w, "step": 3}, storage_writer=dcp.FileSystemWriter(
        "safetensors", serialization_format=SerializationFormat.SAFETENSORS))
    os.chdir(HERE)
    CASES.append(("safetensors", "invalid_foreign", "SAFETENSORS", "serialization_format=SAFETENSORS"))

    # A torch.save file naming DCP's classes stays refused by the checkpoint reader.
    with open(os.path.join(HOSTILE, "metadata-class.pt"), "wb") as f:
        torch.save({"m": MetadataIndex("w")}, f)
    CASES.append(("metadata-class.pt", "pickle/refused", "torch.distributed.checkpoint.metadata.MetadataIndex",
                  "a torch.save file naming a DCP class"))

    with open(os.path.join(HOSTILE, "EXPECTED.tsv"), "w") as f:
        f.write("# case\tkind\tthe message contains\twhat it is\n")
        for c in CASES:
            f.write("\t".join(c) + "\n")


if __name__ == "__main__":
    expected = {}
    for name, make in [("state", state), ("optim", optim), ("sharded", sharded)]:
        values = make()
        with open(os.path.join(HERE, name, ".metadata"), "rb") as f:
            order = list(pickle.load(f).state_dict_metadata)  # our own file: trusted
        assert sorted(order) == sorted(values), (order, sorted(values))
        expected[name] = {"order": order, "values": values}
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    hostile()
    print("wrote", ", ".join(sorted(os.listdir(HERE))), file=sys.stderr)
