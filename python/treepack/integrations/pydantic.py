"""pydantic models as records: saved like dataclasses (a record named ``module:qualname`` holding
the model's fields, then any extra fields the model allows), rebuilt, when the class is trusted,
through ``model_validate`` so the model's validators run on what the file says. Used only when
pydantic is already imported: ``import treepack`` never imports it."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Tuple


def is_model(obj: Any) -> bool:
    mod = sys.modules.get("pydantic")
    return mod is not None and isinstance(obj, mod.BaseModel)


def is_model_class(cls: type) -> bool:
    mod = sys.modules.get("pydantic")
    return mod is not None and isinstance(cls, type) and issubclass(cls, mod.BaseModel)


def fields(obj: Any) -> List[Tuple[str, Any]]:
    out = [(name, getattr(obj, name)) for name in type(obj).model_fields]
    out += list((obj.model_extra or {}).items())
    return out


def build(cls: type, fields: Dict[str, Any]) -> Any:
    """The model, validated (a file that breaks the model's rules raises ``ValueError``)."""
    try:
        return cls.model_validate(fields)
    except Exception as e:  # pydantic.ValidationError is a ValueError; others are the model's own
        raise ValueError(f"the stored fields do not validate as {cls.__qualname__}: {e}") from e
