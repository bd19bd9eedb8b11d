"""scikit-learn: nothing is stored of it; a fitted estimator met by a save is refused with what to
do instead (its fitted state is rebuilt only by scikit-learn's own code)."""

from __future__ import annotations

import sys
from typing import Any, Optional

from .. import _plugin


def _hint(obj: Any) -> Optional[str]:
    sk = sys.modules.get("sklearn.base")
    if sk is not None and isinstance(obj, sk.BaseEstimator):
        return (
            "a scikit-learn estimator holds fitted state that only its own code rebuilds; scikit-learn "
            "recommends skops.io (or pickle/joblib for files you trust): save it that way, or save its "
            "parameters (get_params()) and fitted arrays (the attributes ending in _) as a tree here"
        )
    return None


_plugin.integrate(__name__, hint=_hint)
