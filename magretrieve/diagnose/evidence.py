"""The measured figures diagnose's advice quotes, read from a file the benchmarks write.

``evidence.json`` (shipped inside the package) is written by ``benchmarks/priors.py`` from its
own results and from ``benchmarks/results/quality.json``; the advice strings format these
numbers instead of hard-coding them, so re-running the benchmarks updates what diagnose says.
Without the file the advice is given without figures.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

EVIDENCE_NAME = "evidence.json"


@lru_cache(maxsize=1)
def load_evidence() -> dict[str, Any]:
    """The committed figures ({} when the file is missing or unreadable)."""
    try:
        text = resources.files("magretrieve.diagnose").joinpath(EVIDENCE_NAME).read_text()
        data = json.loads(text)
    except (FileNotFoundError, OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
