"""What `treepack.open`'s views say when a new user reaches for what is not there (session 47)."""

import dataclasses

import pytest

import treepack


@dataclasses.dataclass
class Cfg:
    lr: float = 0.1


def test_a_missing_key_lists_the_keys_there(tmp_path):
    p = tmp_path / "t"
    treepack.save({"d": {"x": 1, "y": 2}, "cfg": Cfg(), "many": {f"k{i}": i for i in range(12)}}, p)
    v = treepack.open(p, trust=[f"{__name__}.*"])
    with pytest.raises(KeyError, match=r"'z' not found in `d` \(dict\); its keys: 'x', 'y'"):
        v["d"]["z"]
    with pytest.raises(KeyError, match=r"'k99' not found in `many` \(dict\); its keys: 'k0', .*'k9', … \(12 in all\)"):
        v["many"]["k99"]
    with pytest.raises(KeyError, match=r"its keys: 'lr' \(its children as stored; \.read\(\) builds the object\)"):
        v["cfg"]["nope"]


def test_an_untrusted_read_says_open_and_names_the_file(tmp_path):
    p = tmp_path / "t"
    treepack.save({"cfg": Cfg()}, p)
    with pytest.raises(treepack.UntrustedTypeError) as info:
        treepack.open(p)["cfg"].read()
    msg = str(info.value)
    assert msg.startswith(f"{p}: refusing to load types"), msg
    assert f"open(..., trust=['{__name__}.*'])" in msg, msg
    assert treepack.open(p, trust=[f"{__name__}.*"])["cfg"].read() == Cfg()
