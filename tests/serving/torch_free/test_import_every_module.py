"""Every module outside train/, export/ and diagnose/ imports without torch and transformers.

The modules are found by walking the installed package (``pkgutil.walk_packages``), not from
a list, so a new module is covered the day it lands. They are imported in a fresh interpreter
with ``torch`` and ``transformers`` blocked in ``sys.modules``, so an import of either fails
even where they are installed. ``scripts/check_serving.sh`` runs this file in a venv holding
only the serving extras; there a module may also refuse with the one-line "install the extra"
error of an optional integration (e.g. LangChain), which is how an absent extra must fail —
never with a ModuleNotFoundError or a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys

#: Layers allowed to import torch (and so left out of the walk).
TORCH_LAYERS = ("magretrieve.train", "magretrieve.export", "magretrieve.diagnose")
BLOCKED = ("torch", "transformers")

WALK = f"""
import importlib, json, pkgutil, sys
for name in {BLOCKED!r}:
    sys.modules[name] = None
import magretrieve
from magretrieve.core.errors import MagRetrieveError

results = {{}}
# walk_packages imports each package to list its modules; a package that refuses (an optional
# layer without its extra) is recorded by the loop's own import below, so the walk skips it
for info in pkgutil.walk_packages(magretrieve.__path__, "magretrieve.", onerror=lambda name: None):
    name = info.name
    if name.startswith({TORCH_LAYERS!r}) or name.rsplit(".", 1)[-1] == "__main__":
        continue  # __main__ modules run the CLI when imported
    try:
        importlib.import_module(name)
        results[name] = "ok"
    except MagRetrieveError as exc:
        results[name] = "refused: " + str(exc)
    except BaseException as exc:
        results[name] = "error: " + type(exc).__name__ + ": " + str(exc)
for name in {BLOCKED!r}:
    assert sys.modules.get(name) is None, name + " got imported"
print(json.dumps(results))
"""


def walk() -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_module_outside_the_torch_layers_imports_without_torch() -> None:
    results = walk()
    # the walk found the package's layers, not an empty or partial tree
    layers = {name.split(".")[1] for name in results}
    assert {"core", "data", "serving", "stores", "priors", "engines", "cli"} <= layers
    assert "magretrieve.serving.retriever" in results and "magretrieve.cli.cmd_train" in results
    assert not any(name.startswith(TORCH_LAYERS) for name in results)
    failed = {
        name: outcome
        for name, outcome in results.items()
        if outcome != "ok"
        # an optional integration whose extra is absent refuses in one line naming the extra
        and not (outcome.startswith("refused: ") and "pip install 'magretrieve[" in outcome)
    }
    assert not failed, "\n".join(f"{name}: {outcome}" for name, outcome in failed.items())
