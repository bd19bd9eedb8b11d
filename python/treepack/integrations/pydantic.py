"""pydantic models as records: saved like dataclasses (a record named ``module:qualname`` holding
the model's fields, then any extra fields the model allows), rebuilt, when the class is trusted,
from the stored values once ``model_validate`` has checked them (the model's validators run on
what the file says; what comes back is what was saved). A save checks the same, so that a model
whose fields do not validate again is refused rather than saved never to load. Used only when
pydantic is already imported: ``import treepack`` never imports it."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

from .. import _plugin


def is_model(obj: Any) -> bool:
    mod = sys.modules.get("pydantic")
    return mod is not None and isinstance(obj, mod.BaseModel)


def is_model_class(cls: type) -> bool:
    mod = sys.modules.get("pydantic")
    return mod is not None and isinstance(cls, type) and issubclass(cls, mod.BaseModel)


def fields(obj: Any, where: str = "") -> List[Tuple[str, Any]]:
    """A model's children: its fields, the extra fields it allows (``__pydantic_extra__``), its
    private attributes (``PrivateAttr``, ``__pydantic_private__``) and, last, the names of the
    fields that were given (``__pydantic_fields_set__``, which ``model_dump(exclude_unset=True)``
    reads)."""
    t = type(obj)
    out = [(name, getattr(obj, name)) for name in t.model_fields]
    out += list((obj.model_extra or {}).items())
    # A load validates the stored fields (`build`): a model whose own fields do not validate
    # again (a validator that splits a str, or refuses its own output) would save and then never
    # load. Refused here, where the user can still fix it.
    try:
        _validate(t, dict(out))
    except Exception as e:  # pydantic.ValidationError is a ValueError; others are the model's own
        raise TypeError(
            f"cannot save `{where or '<root>'}`: the fields of this {t.__qualname__} do not validate again as one, "
            f"and a load validates them (so it could never be loaded): {e}. Make its validators accept what they "
            "return (a `mode='before'` validator that splits a str should pass a list through), or save "
            "obj.model_dump() instead"
        ) from None
    private = getattr(obj, "__pydantic_private__", None) or {}
    out += [(k, v) for k, v in private.items()]
    given = obj.model_fields_set
    # A load validates every stored field, which marks them all given: only a model made
    # with some fields left to their defaults needs its set written down.
    if given != set(t.model_fields) | set(obj.model_extra or {}):
        out.append((FIELDS_SET, sorted(given)))
    return out


FIELDS_SET = "__pydantic_fields_set__"


def build(cls: type, fields: Dict[str, Any]) -> Any:
    """The model the stored fields describe. The file must satisfy the model's rules: its fields
    and extras are validated (``model_validate``, by field name whatever the aliases; a file
    that breaks a rule raises ``ValueError``). What comes back holds the stored values as they
    are, as pickle gives them (``model_construct``): a validator that changes what it is given
    (doubles a number, coerces an int to a float) does not change them again at every round
    trip. Private attributes and the fields given are put back."""
    kids = dict(fields)
    given = kids.pop(FIELDS_SET, None)
    declared = getattr(cls, "__private_attributes__", None) or {}
    private = {k: kids.pop(k) for k in list(kids) if k in declared}
    try:
        _validate(cls, kids)
    except Exception as e:  # pydantic.ValidationError is a ValueError; others are the model's own
        raise ValueError(f"the stored fields do not validate as {cls.__qualname__}: {e}") from e
    names = set(cls.model_fields) | {k for k in kids if k not in cls.model_fields}
    if given is not None and (not isinstance(given, list) or not all(isinstance(n, str) and n in names for n in given)):
        raise ValueError(f"{FIELDS_SET} must list fields of {cls.__qualname__}, got {given!r}")
    obj = cls.model_construct(_fields_set=set(given) if given is not None else names, **kids)
    if private:
        store = getattr(obj, "__pydantic_private__", None)
        if not isinstance(store, dict):
            raise ValueError(f"{cls.__qualname__} holds no private attributes, but the file gives {sorted(private)}")
        store.update(private)
    return obj


def _validate(cls: type, kids: Dict[str, Any]) -> None:
    """``model_validate`` of the stored fields, which are keyed by field name (a model with
    aliases takes its fields by alias unless told otherwise)."""
    # Strict: the stored values are what the model held, of its fields' own types (a nested
    # model is one, not a dict of its fields; an int field holds an int, not a string of
    # digits), so what comes back, made of them, is a model that validates.
    try:
        cls.model_validate(kids, by_name=True, strict=True)
    except TypeError as e:  # a pydantic before 2.11, without by_name: the aliases' keys
        if "by_name" not in str(e):
            raise
        by_alias = {}
        for k, v in kids.items():
            f = cls.model_fields.get(k)
            alias = getattr(f, "validation_alias", None) or getattr(f, "alias", None)
            by_alias[alias if isinstance(alias, str) else k] = v
        cls.model_validate(by_alias, strict=True)


# ---------------------------------------------------------------- the plug-in


def _record_fields(obj: Any, where: str) -> Optional[List[Tuple[str, Any]]]:
    return fields(obj, where) if is_model(obj) else None


_plugin.integrate(__name__, record_fields=_record_fields, record_class=is_model_class, record_build=build)
