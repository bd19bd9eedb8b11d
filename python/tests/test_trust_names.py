"""A trusted name reaches only the class defined where the name says, and each node kind checks
what it builds before anything is called (issue 50, finding 1).

Each hostile case runs in a child process (``attack`` fixture): a package ``mypkg`` on the
child's path imports ``subprocess``, ``tempfile``, ``os`` and the canary module, and defines one
dataclass, one enum and one namedtuple of its own. Files name things reachable *through*
``mypkg`` under every node kind that resolves a class; with ``trust=["mypkg.*"]`` each must be
refused by name, nothing outside the location may change, and nothing may be constructed.
"""

import json
import textwrap

import pytest

MYPKG = textwrap.dedent(
    """
    import collections, dataclasses, enum, os, subprocess, tempfile
    from mypkg_helpers import Boom

    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    class Color(enum.Enum):
        RED = 1

    Pair = collections.namedtuple("Pair", "a b")

    class Plain:
        def __init__(self):
            self.v = 1

    class Outer:
        @dataclasses.dataclass
        class Inner:
            z: int

        helper = subprocess  # a module reached through a class

    class _Lazy:
        # A lazy proxy (django's settings, werkzeug's LocalProxy): its class is computed, by
        # running its factory, the first time anything asks.
        @property
        def __class__(self):
            Boom()
            return Point

    lazy = _Lazy()
    """
)

#: A real save of each node kind, whose class name the case rewrites.
SAVE = """
import dataclasses, enum, collections, os, sys, json
sys.path.insert(0, os.path.join(OUTSIDE, "pkgs"))
import treepack, mypkg
tree = {
    "rec": mypkg.Point(1, 2),
    "enum": mypkg.Color.RED,
    "nt": mypkg.Pair(1, 2),
    "dd": collections.defaultdict(mypkg.Plain, {"k": 1}),
    "inner": mypkg.Outer.Inner(3),
}
treepack.save(tree, LOC)
text = open(os.path.join(LOC, "treepack.json")).read()
"""

RESEAL = """
import blake3
def reseal(text):
    body = text[: text.rindex(',\\n"manifest_hash"')]
    h = blake3.blake3(body.encode()).hexdigest()
    open(os.path.join(LOC, "treepack.json"), "w").write(body + ',\\n"manifest_hash":"' + h + '"}\\n')
"""


@pytest.fixture
def pkg(attack):
    d = attack.outside / "pkgs"
    d.mkdir()
    (d / "mypkg.py").write_text(MYPKG)
    # A class mypkg imports (not defined there) whose construction or finalisation is visible.
    (d / "mypkg_helpers.py").write_text(textwrap.dedent(f"""
        import os
        class Boom:
            def __init__(self, *a, **k):
                open(os.path.join({str(attack.outside)!r}, "CONSTRUCTED"), "w").close()
            def __del__(self):
                open(os.path.join({str(attack.outside)!r}, "CONSTRUCTED"), "w").close()
        """))
    # The package's own files are part of what must not change.
    from hostile_harness import _snapshot

    attack.before = _snapshot(attack.outside)
    return attack


def _case(old: str, new: str, load: str = "treepack.load(LOC, trust=['mypkg.*'])") -> str:
    return SAVE + RESEAL + textwrap.dedent(
        f"""
        assert {old!r} in text, text
        reseal(text.replace({old!r}, {new!r}))
        import sys
        sys.modules.pop("mypkg", None)
        result = {load}
        """
    )


#: Where a file names a class (a record, an enum node, a defaultdict's factory), and what it
#: may write there instead with the word the refusal must contain.
REFUSED_NAMES = {
    '"mypkg:Point"': [
        # A record naming a class mypkg imports (tempfile's closer deletes a file in __del__).
        ('"mypkg:tempfile._TemporaryFileCloser"', "module"),
        ('"mypkg:subprocess.Popen"', "module"),
        ('"mypkg:Boom"', "defined elsewhere"),
        # A record naming a class defined in mypkg that is no dataclass/namedtuple/model.
        ('"mypkg:Plain"', "dataclass"),
        # Through a dotted module name; a name that is not a name.
        ('"mypkg.subprocess:Popen"', "cannot be"),
        ('"mypkg:Point.__init__.__globals__"', "Point"),
        ('"mypkg:lazy"', "not a class"),
    ],
    # An enum node naming a callable that is not an Enum.
    '"class":"mypkg:Color"': [
        ('"class":"mypkg:subprocess.Popen"', "module"),
        ('"class":"mypkg:Boom"', "defined elsewhere"),
        ('"class":"mypkg:Plain"', "Enum"),
        ('"class":"mypkg:os.system"', "module"),
        ('"class":"mypkg:lazy"', "not a class"),
    ],
    # Through a class attribute; through a lazy proxy, whose class asked runs its factory
    # (session 45: `isinstance(obj, type)` read `obj.__class__`).
    '"mypkg:Outer.Inner"': [('"mypkg:Outer.helper.Popen"', "not a class"), ('"mypkg:lazy.Inner"', "not a class")],
    # A defaultdict's factory.
    '"factory":"mypkg:Plain"': [
        ('"factory":"mypkg:subprocess.Popen"', "module"),
        ('"factory":"mypkg:Boom"', "defined elsewhere"),
        ('"factory":"mypkg:lazy"', "not a class"),
    ],
}


@pytest.mark.parametrize(
    "old,new,what", [(old, new, what) for old, cases in REFUSED_NAMES.items() for new, what in cases]
)
def test_a_trusted_glob_reaches_only_classes_defined_under_it(pkg, old, new, what):
    r = pkg.error(_case(old, new), "TreepackError", "LookupError", "ValueError")
    assert what in r["message"], r["message"]
    # The refusal names the stored name.
    assert new.split(":", 1)[1].strip('"').split(".")[0] in r["message"] or "mypkg" in r["message"], r["message"]


def test_refused_names_become_placeholders_when_asked(pkg):
    code = _case('"mypkg:Point"', '"mypkg:subprocess.Popen"', "treepack.load(LOC, trust=['mypkg.*'], on_missing='placeholder')")
    code += "\nassert isinstance(result['rec'], treepack.Unloadable), result\nassert 'module' in result['rec'].reason\n"
    code += "assert result['enum'] is mypkg.Color.RED or type(result['enum']).__name__ == 'Color'\n"
    r = pkg.run(code)
    assert r["outcome"] == "ok", r


def test_the_classes_defined_under_the_glob_still_load(pkg):
    code = SAVE + textwrap.dedent(
        """
        sys.modules.pop("mypkg", None)
        back = treepack.load(LOC, trust=["mypkg.*"])
        import mypkg as m2
        assert back["rec"] == m2.Point(1, 2) and type(back["rec"]) is m2.Point
        assert back["enum"] is m2.Color.RED
        assert back["nt"] == m2.Pair(1, 2) and type(back["nt"]) is m2.Pair
        assert back["dd"].default_factory is m2.Plain and back["dd"]["k"] == 1
        assert back["inner"] == m2.Outer.Inner(3)
        result = "ok"
        """
    )
    r = pkg.run(code)
    assert r["outcome"] == "ok" and r["result"] == "'ok'", r


def test_main_module_classes_resolve_in_the_same_process(tmp_path):
    import dataclasses

    import treepack

    @dataclasses.dataclass
    class Local:
        a: int

    p = str(tmp_path / "t")
    treepack.save({"x": Local(1)}, p)
    back = treepack.load(p, trust=["test_trust_names.*"])
    assert back["x"] == Local(1)


def test_a_module_named_like_main_is_never_imported(pkg):
    r = pkg.error(_case('"mypkg:Point"', '"mypkg.__main__:Point"'), "TreepackError", "LookupError")
    assert "__main__" in r["message"], r["message"]


@pytest.mark.parametrize("load", [
    "treepack.load(LOC, trust='mypkg.*')",
    "treepack.open(LOC, trust='mypkg.*')['rec'].read()",
    "treepack.load(LOC, trust='mypkg.*', framework='torch')",
])
def test_trust_given_as_one_string_is_one_glob(pkg, load):
    # trust="mypkg.*" trusted every class: the string was taken as its characters, one of which,
    # "*", is a glob that matches any name. A class outside mypkg is refused by name.
    r = pkg.error(_case('"mypkg:Point"', '"mypkg_helpers:Boom"', load), "UntrustedTypeError")
    assert "mypkg_helpers:Boom" in r["message"], r["message"]


def test_trust_takes_strings_only(tmp_path):
    import treepack

    treepack.save({"a": 1}, tmp_path / "t")
    assert treepack.load(tmp_path / "t", trust="mypkg.*") == {"a": 1}
    assert treepack.untrusted_types(tmp_path / "t", trust="x") == {}
    for bad, word in ((b"mypkg.*", "bytes"), (3, "int"), ([treepack.Unloadable], "cls.__module__")):
        with pytest.raises(TypeError, match=word):
            treepack.load(tmp_path / "t", trust=bad)


def test_a_dotted_name_through_a_plain_module_runs_none_of_its_code(pkg):
    # `victim.os:system`: importing `victim.os` made Python ask the module `victim` for its
    # `__path__`, which ran victim's `__getattr__`. A parent must be a package (its `__path__` in
    # its own namespace) before anything below it is imported.
    (pkg.outside / "pkgs" / "victim.py").write_text(textwrap.dedent(f"""
        import os
        def __getattr__(name):
            open(os.path.join({str(pkg.outside)!r}, "CONSTRUCTED"), "w").close()
            raise AttributeError(name)
        """))
    from hostile_harness import _snapshot

    pkg.before = _snapshot(pkg.outside)
    r = pkg.error(_case('"mypkg:Point"', '"victim.os:system"', "treepack.load(LOC, trust=['victim.*', 'mypkg.*'])"),
                  "TreepackError", "LookupError", "ValueError")
    assert "not a package" in r["message"] and "victim.os:system" in r["message"], r["message"]
