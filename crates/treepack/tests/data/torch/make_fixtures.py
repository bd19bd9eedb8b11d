"""Writes the torch.save fixtures of crates/treepack/tests/torch.rs and the hostile corpus of
crates/treepack/tests/torch_hostile.rs (issue 54), with the expectations they are checked
against. Run from the repository root with a Python that has torch and numpy:

    .venv/bin/python crates/treepack/tests/data/torch/make_fixtures.py

Everything is deterministic (fixed seeds, fixed inputs); the files are committed.
"""

import collections
import io
import json
import os
import pickle
import struct
import subprocess
import zipfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTILE = os.path.join(HERE, "hostile")


def tensor_expect(t):
    """dtype, shape and the C-order little-endian bytes (hex) of a tensor."""
    c = t.detach().contiguous()
    raw = c.view(torch.int16) if c.dtype == torch.bfloat16 else c
    return {"dtype": str(c.dtype).replace("torch.", ""), "shape": list(c.shape), "hex": raw.numpy().tobytes().hex(),
            "parameter": isinstance(t, torch.nn.Parameter), "requires_grad": bool(t.requires_grad)}


def tensors(obj, path, out):
    if isinstance(obj, torch.Tensor):
        out[path] = tensor_expect(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            tensors(v, f"{path}/{k}" if path else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            tensors(v, f"{path}/{i}" if path else str(i), out)
    return out


def save(name, obj):
    path = os.path.join(HERE, name)
    torch.save(obj, path)
    return tensors(obj, "", {})


def fixtures():
    torch.manual_seed(0)
    expect = {}
    base = torch.arange(12, dtype=torch.float32)
    inner = collections.OrderedDict()
    inner["scale"] = torch.tensor([0.5, -1.25], dtype=torch.float16)
    inner["bf"] = torch.tensor([1.0, -2.5, 3.140625], dtype=torch.bfloat16)
    sd = collections.OrderedDict()
    sd["w"] = torch.randn(3, 4)
    sd["ids"] = torch.tensor([1, -2, 3_000_000_000], dtype=torch.int64)
    sd["mask"] = torch.tensor([True, False, True])
    sd["wt"] = sd["w"].t()  # non-contiguous view of w's storage
    sd["a"] = base[:6]  # a and b share one storage
    sd["b"] = base[6:].view(2, 3)
    sd["nested"] = {"inner": inner, "size": torch.Size([2, 3]), "n": 7, "x": 2.5, "s": "text", "none": None,
                    "big": 2**70, "list": [1, "two", 3.0], "tuple": (True, None)}
    sd["param"] = torch.nn.Parameter(torch.ones(2))
    sd["scalar"] = torch.tensor(3.5, dtype=torch.float64)
    sd["empty"] = torch.zeros(0, 3)
    sd["numpy"] = np.arange(4, dtype=">i4")
    sd["fortran"] = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    sd["np_scalar"] = np.float64(1.5)
    sd["set"] = {1, 2}
    expect["state_dict.pt"] = save("state_dict.pt", sd)

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    expect["optimizer.pt"] = save("optimizer.pt", opt.state_dict())
    expect["model.pt"] = save("model.pt", model.state_dict())

    big = torch.arange(100, dtype=torch.int32)
    expect["offset.pt"] = save("offset.pt", {"slice": big[37:45].clone()[2:6], "alone": big[10:20]})
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(expect, f, indent=1, sort_keys=True)
        f.write("\n")


# ---- The hostile corpus: each file and the error it must get. ----

CASES = []  # (file, kind, text the message must contain, what it is)


def case(name, kind, needle, what, data):
    with open(os.path.join(HOSTILE, name), "wb") as f:
        f.write(data)
    CASES.append((name, kind, needle, what))


def as_zip(pkl, storages=(), compress=False, prefix="archive", extra=()):
    """A torch.save-shaped zip around the pickle bytes `pkl`."""
    b = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(b, "w", method) as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        z.writestr(f"{prefix}/byteorder", "little")
        for k, v in storages:
            z.writestr(f"{prefix}/data/{k}", v)
        for n, v in extra:
            z.writestr(n, v)
        z.writestr(f"{prefix}/version", "3\n")
    return b.getvalue()


class Reduce:
    def __init__(self, f, args):
        self.f, self.args = f, args

    def __reduce__(self):
        return (self.f, self.args)


def dumps(obj):
    return pickle.dumps(obj, protocol=2)


def g(module, name):
    """A GLOBAL opcode."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def rep(data, old, new):
    """`data` with the first `old` replaced by `new` (which must be there)."""
    assert old in data, (old, data)
    return data.replace(old, new, 1)


def hooked(pkl):
    """A real data.pkl whose backward-hooks OrderedDict gets an item."""
    at = pkl.index(b"collections\nOrderedDict\n")
    return pkl[:at] + rep(pkl[at:], b")R", b")RK\x01K\x02s")


def real_pickle():
    b = io.BytesIO()
    torch.save({"w": torch.ones(2)}, b)
    return zipfile.ZipFile(b).read("archive/data.pkl")


def hostile():
    os.makedirs(HOSTILE, exist_ok=True)
    for f in os.listdir(HOSTILE):
        os.remove(os.path.join(HOSTILE, f))
    import builtins
    import pkgutil
    # Code-execution gadgets, each as torch.load would meet it inside a checkpoint.
    case("reduce-os-system.pt", "refused", "posix.system", "__reduce__ to os.system",
         as_zip(dumps({"w": Reduce(os.system, ("touch /tmp/treepack-pwned",))})))
    case("reduce-popen.pt", "refused", "Popen", "__reduce__ to subprocess.Popen (protocol 2 names it commands.Popen)",
         as_zip(dumps({"layer": {"weight": Reduce(subprocess.Popen, (["true"],))}})))
    case("getattr-chain.pt", "refused", "builtins.getattr", "builtins.getattr(builtins, 'eval') chain",
         as_zip(b"\x80\x02" + g("builtins", "getattr") + g("builtins", "__import__") + b"X\x02\x00\x00\x00os\x85R"
                + b"X\x06\x00\x00\x00system\x86R.") )
    case("eval.pt", "refused", "__builtin__.eval", "builtins.eval (protocol 2 names it __builtin__.eval)",
         as_zip(dumps({"x": Reduce(builtins.eval, ("1+1",))})))
    case("exec.pkl", "refused", "__builtin__.exec", "builtins.exec in a bare pickle (protocol 2 spelling)",
         dumps(Reduce(builtins.exec, ("import os",))))
    case("py2-builtin-eval.pkl", "refused", "__builtin__.eval", "__builtin__.eval (protocol 0 spelling)",
         g("__builtin__", "eval") + b"(S'1'\ntR.")
    case("resolve-name.pt", "refused", "pkgutil.resolve_name", "pkgutil.resolve_name('os:system')",
         as_zip(dumps({"w": Reduce(pkgutil.resolve_name, ("os:system",))})))
    case("torch-utils-other.pt", "refused", "torch._utils._rebuild_device_tensor_from_numpy",
         "a torch._utils function outside the allow-list",
         as_zip(b"\x80\x02}(X\x01\x00\x00\x00w" + g("torch._utils", "_rebuild_device_tensor_from_numpy") + b")Ru."))
    case("torch-import-dotted.pt", "refused", "torch._utils._import_dotted_name",
         "torch._utils._import_dotted_name('os.system')",
         as_zip(b"\x80\x02" + g("torch._utils", "_import_dotted_name") + b"X\x09\x00\x00\x00os.system\x85R."))
    case("torch-load.pt", "refused", "torch.load", "torch.load itself",
         as_zip(b"\x80\x02" + g("torch", "load") + b"X\x01\x00\x00\x00x\x85R."))
    case("inst-os-system.pkl", "refused", "os.system", "INST of os.system (protocol 0)",
         b"(S'echo hi'\nios\nsystem\n.")
    case("obj-popen.pkl", "refused", "subprocess.Popen", "OBJ of subprocess.Popen",
         b"(" + g("subprocess", "Popen") + b"]S'true'\naaso.")
    case("newobj-popen.pkl", "refused", "subprocess.Popen", "NEWOBJ of subprocess.Popen",
         b"\x80\x02" + g("subprocess", "Popen") + b"]X\x04\x00\x00\x00truea\x85\x81.")
    case("stack-global-system.pkl", "refused", "os.system", "STACK_GLOBAL of os.system (protocol 4)",
         b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R.")
    case("build-on-list.pkl", "bad_call", "BUILD", "BUILD (__setstate__) on a list",
         b"\x80\x02]}b.")
    case("build-on-dict.pkl", "bad_call", "BUILD", "BUILD (__setstate__) with a dict on a plain dict",
         b"\x80\x02}}(X\x01\x00\x00\x00wNub.")
    case("build-setstate-global.pkl", "refused", "os.system", "BUILD whose state holds os.system",
         b"\x80\x02]}(X\x01\x00\x00\x00x" + g("os", "system") + b"ub.")
    case("call-dtype.pkl", "bad_call", "torch.float32", "calling torch.float32, a value, as a function",
         b"\x80\x02" + g("torch", "float32") + b")R.")
    case("hooks.pt", "bad_call", "hooks", "_rebuild_tensor_v2 with backward hooks",
         as_zip(hooked(real_pickle()), [("0", b"\0" * 8)]))
    case("persid-text.pkl", "opcode", "PERSID", "a text persistent id", b"P0\n.")
    case("persid-not-storage.pkl", "bad_call", "persistent id", "a persistent id that is not a storage",
         b"\x80\x02X\x06\x00\x00\x00module\x85Q.")
    case("ext1.pkl", "opcode", "EXT1", "an extension code (copyreg registry)", b"\x80\x02\x82\x01.")
    case("next-buffer.pkl", "opcode", "NEXT_BUFFER", "an out-of-band buffer", b"\x80\x05\x97.")
    # Opcode-level attacks.
    case("long4-huge.pkl", "limit", "integer size", "LONG4 declaring 2^31-1 bytes", b"\x80\x02\x8b\xff\xff\xff\x7f.")
    case("binbytes8-huge.pkl", "truncated", "BINBYTES8", "BINBYTES8 declaring 10^12 bytes",
         b"\x80\x04\x8e" + struct.pack("<Q", 10**12) + b"abc.")
    case("binunicode8-huge.pkl", "truncated", "BINUNICODE8", "BINUNICODE8 declaring 2^63 bytes",
         b"\x80\x04\x8d" + struct.pack("<Q", 2**63) + b"abc.")
    case("frame-huge.pkl", "truncated", "FRAME", "a FRAME of 2^60 bytes", b"\x80\x04\x95" + struct.pack("<Q", 2**60) + b"N.")
    case("memo-get-missing.pkl", "malformed", "memo", "LONG_BINGET of an index never stored",
         b"\x80\x02j\xff\xff\xff\xff.")
    case("memo-put-huge.pkl", "limit", "memo index", "LONG_BINPUT at index 2^32-1", b"\x80\x02Nr\xff\xff\xff\xff.")
    case("underflow.pkl", "malformed", "underflow", "REDUCE on an empty stack", b"\x80\x02R.")
    case("stop-empty.pkl", "malformed", "underflow", "STOP with nothing on the stack", b".")
    case("mark-missing.pkl", "malformed", "MARK", "TUPLE without a MARK", b"\x80\x02NNt.")
    case("mark-underflow.pkl", "malformed", "underflow", "TUPLE2 reaching below its MARK", b"\x80\x02N(N\x86.")
    case("dict-odd.pkl", "malformed", "odd", "DICT of an odd number of items", b"(NNNd.")
    case("deep-marks.pkl", "limit", "depth", "5 000 nested MARKs", b"\x80\x02" + b"(" * 5_000 + b".")
    case("deep-lists.pkl", "limit", "depth", "5 000 nested lists",
         b"\x80\x02" + b"]" * 5_000 + b"a" * 4_999 + b".")
    case("billion-laughs.pkl", "limit", "tree nodes", "a list of two copies of a list of two... 64 levels",
         b"\x80\x02N" + b"2\x86" * 64 + b".")
    case("cycle.pkl", "malformed", "cycle", "a list that contains itself", b"\x80\x02]q\x00h\x00a.")
    case("truncated.pt", "truncated", "truncated", "a real data.pkl cut in half",
         as_zip(real_pickle()[: len(real_pickle()) // 2]))
    case("unknown-opcode.pkl", "opcode", "unknown", "byte 0xff as an opcode", b"\x80\x02\xff.")
    case("proto-6.pkl", "malformed", "protocol", "protocol 6", b"\x80\x06N.")
    case("tensor-past-storage.pt", "bad_call", "past its storage", "a tensor reaching past its storage",
         as_zip(rep(real_pickle(), b"K\x00K\x02\x85", b"K\x00K\x09\x85"), [("0", b"\0" * 8)]))
    # Zip-level attacks.
    sd = io.BytesIO()
    torch.save({"w": torch.ones(4)}, sd)
    good = sd.getvalue()
    src = zipfile.ZipFile(io.BytesIO(good))
    case("compressed.pt", "invalid_foreign", "compressed", "a storage entry compressed with deflate",
         as_zip(src.read("archive/data.pkl"), [("0", src.read("archive/data/0"))], compress=True))
    case("storage-size.pt", "invalid_foreign", "holds 8 bytes", "a storage entry shorter than its tensor's storage",
         as_zip(src.read("archive/data.pkl"), [("0", b"\0" * 8)]))
    case("storage-missing.pt", "invalid_foreign", "no entry", "a storage the zip does not have",
         as_zip(src.read("archive/data.pkl")))
    # A storage entry whose sizes in the central directory say 2^31 bytes: past the file's end.
    z = bytearray(as_zip(src.read("archive/data.pkl"), [("0", src.read("archive/data/0"))]))
    cd = z.find(b"PK\x01\x02" + bytes(z[z.find(b"PK\x01\x02") + 4: z.find(b"PK\x01\x02") + 4]))
    while z[cd + 46: cd + 46 + 14] != b"archive/data/0":
        cd = z.find(b"PK\x01\x02", cd + 4)
    z[cd + 20: cd + 28] = struct.pack("<II", 2**31, 2**31)
    case("storage-past-end.pt", "invalid_foreign", "past the end", "a storage entry whose size reaches past the file", bytes(z))
    case("dotdot.pt", "invalid_foreign", "escapes", "a zip entry named archive/../../etc/passwd",
         as_zip(src.read("archive/data.pkl"), [("0", src.read("archive/data/0"))], extra=[("archive/../../etc/passwd", "x")]))
    case("no-data-pkl.pt", "invalid_foreign", "data.pkl", "a zip without data.pkl",
         zipfile.ZipFile and _plain_zip())
    legacy = io.BytesIO()
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    case("legacy.pt", "invalid_foreign", "legacy torch.save format", "the pre-1.6 format", legacy.getvalue())
    case("not-zip.pt", "invalid_foreign", "not a zip", "text", b"hello, this is not a checkpoint\n")
    with open(os.path.join(HOSTILE, "EXPECTED.tsv"), "w") as f:
        f.write("# file\texpected kind (PickleError::kind, or Error::kind)\ttext in the message\twhat it is (made by make_fixtures.py)\n")
        for row in CASES:
            f.write("\t".join(row) + "\n")


def _plain_zip():
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr("readme.txt", "hi")
    return b.getvalue()


if __name__ == "__main__":
    fixtures()
    hostile()
