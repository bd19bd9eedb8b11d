"""The trust audit: what a load would need that is not allowed, found from the manifest alone
(nothing is imported or constructed)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from .. import _registry as reg
from .builtins import BUILTIN_TYPES
from .everyday import FACTORIES


def audit(types: List[Tuple[str, str, Optional[str], str]], trust: Tuple[str, ...], allow_pickle: bool) -> Dict[str, List[str]]:
    """Every type a load would need that is not allowed: {type name: [key paths]}. Imports nothing."""
    bad: Dict[str, List[str]] = {}

    def flag(name: str, path: str) -> None:
        bad.setdefault(name, []).append(path or "<root>")

    def named_class(data_json: Optional[str]) -> Any:
        # (a file's data may be any JSON: a class named by anything but a str names none)
        data = json.loads(data_json) if data_json else None
        cls = data.get("class", "?") if isinstance(data, dict) else "?"
        return cls if isinstance(cls, str) else f"{cls!r:.40}"

    for kind, name, data_json, path in types:
        if kind == "record":
            if not (reg.is_trusted(name, trust) or reg.lookup_name(name)):
                flag(name, path)
        elif name == "py.pickle":
            if not allow_pickle:
                flag(f"pickle ({named_class(data_json)})", path)
        elif name == "py.defaultdict":
            data = (json.loads(data_json) or {}) if data_json else {}
            factory = data.get("factory") if isinstance(data, dict) else None
            if factory is not None and not isinstance(factory, str):
                flag(f"defaultdict factory {factory!r:.40}", path)
            elif factory and factory not in FACTORIES and not (reg.is_trusted(factory, trust) or reg.lookup_name(factory)):
                flag(factory, path)
        elif name in ("py.enum", "py.mapping"):
            data = (json.loads(data_json) or {}) if data_json else {}
            cls = named_class(data_json)
            if not (reg.is_trusted(cls, trust) or reg.lookup_name(cls)):
                flag(cls, path)
            # (a defaultdict subclass's factory)
            factory = data.get("factory") if name == "py.mapping" and isinstance(data, dict) else None
            if factory is not None and not isinstance(factory, str):
                flag(f"defaultdict factory {factory!r:.40}", path)
            elif factory and factory not in FACTORIES and not (reg.is_trusted(factory, trust) or reg.lookup_name(factory)):
                flag(factory, path)
        elif name in reg.CLASS_NODES:  # an integration's node naming its class (jax.pytree)
            cls = named_class(data_json)
            if not (reg.is_trusted(cls, trust) or reg.lookup_name(cls)):
                flag(cls, path)
        elif name.startswith("py."):
            if name not in BUILTIN_TYPES:
                flag(name, path)
        elif reg.lookup_name(name) is None:
            flag(name, path)
    return bad
