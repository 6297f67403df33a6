"""Every console command run without the extra it needs, and how it must refuse.

One table (:data:`CASES`), run in two places:

- ``tests/cli/test_missing_extras.py``, where every extra is installed: the case's modules are
  blocked in ``sys.modules`` of a fresh CLI process, as a missing install leaves them;
- ``tests/serving/torch_free/test_cli_extras.py``, in the serve-only venv of
  ``scripts/check_serving.sh`` (``[serve,faiss,qdrant-edge]``), where they are really absent.

Each run must end with exit code 1 and one line on stderr, ``Error: ...`` naming
``pip install 'magretrieve[EXTRA]'``, with no traceback, and must write nothing: every path a
command would create lies under ``{out}``, which stays empty.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from magretrieve.core.extras import EXTRAS


def modules_of(extra: str) -> tuple[str, ...]:
    """The top-level modules ``extra`` installs (``magretrieve.core.extras.EXTRAS``)."""
    return tuple(module for module, (_, owner) in EXTRAS.items() if owner == extra)


@dataclass(frozen=True)
class Case:
    """``magretrieve ARGS`` without ``extra``; the line must also hold ``says`` (what needed it).

    ``args`` (split on spaces) may name ``{export}`` (a qnorm export), ``{cosine}`` (a cosine
    export), ``{source}`` (a FAISS store that export built), ``{model}`` (a Hugging Face
    folder), ``{beir}`` (a BEIR folder), ``{corpus}`` (its corpus.jsonl), ``{sts}`` (an STS pair
    file), ``{queries}`` (a query file) and ``{out}`` (an empty folder for what would be
    written). ``blocked`` are the modules blocked where they are installed (default: every
    module of the extra). ``with_torch``: the case reaches its extra only past PyTorch, so it
    is left out of the serve-only venv (which refuses it for ``train`` first).
    """

    id: str
    args: str
    extra: str
    says: str = ""
    blocked: tuple[str, ...] = ()
    with_torch: bool = False

    @property
    def command(self) -> str:
        return self.args.split()[0]

    @property
    def modules(self) -> tuple[str, ...]:
        return self.blocked or modules_of(self.extra)

    def argv(self, paths: dict[str, Path]) -> list[str]:
        return self.args.format(**{k: str(v) for k, v in paths.items()}).split()


#: The modules of the ``train`` extra without which no PyTorch model loads.
TORCH = ("torch", "transformers")
INDEX = "index {export} {corpus} --no-progress --store"

CASES: list[Case] = [
    # the HTTP server
    Case("serve", "serve {export} --port 0", "server", "magretrieve serve needs"),
    Case(
        "serve-with-store",
        "serve {export} --store faiss:{out}/ix --port 0",
        "server",
        "magretrieve serve needs",
    ),
    # PyTorch: training, export, diagnose, and eval / fit-prior of a model that is no export
    Case(
        "train",
        "train --model {model} --train {beir}:train --out {out}/run",
        "train",
        "magretrieve train needs torch",
        TORCH,
    ),
    Case(
        "export", "export {model} {out}/exported", "train", "magretrieve export needs torch", TORCH
    ),
    Case(
        "diagnose",
        "diagnose --model {model} --data {beir}:train --skip-probes --out {out}/report",
        "train",
        "magretrieve diagnose needs torch",
        TORCH,
    ),
    Case(
        "eval-model",
        "eval --model {model} --data {beir}:test",
        "train",
        "--model {model} (not an ONNX export",
        TORCH,
    ),
    Case(
        "fit-prior-model",
        "fit-prior --model {model} --data {beir}:train --out {out}/p.json",
        "train",
        "--model {model} (not an ONNX export",
        TORCH,
    ),
    Case(
        "export-int8-static",
        "export {model} {out}/exported --quantize int8-static --calibration-data {beir}",
        "openvino-int8",
        "--quantize int8-static needs nncf",
        ("nncf",),
        with_torch=True,
    ),
    # STS evaluation (scipy), refused before anything is encoded
    Case("eval-sts", "eval --model {export} --data {sts}", "eval", "STS evaluation", ("scipy",)),
    # engines and runtimes
    Case("index-engine-ray", f"{INDEX} faiss:{{out}}/ix --engine ray", "ray", "engine 'ray'"),
    Case(
        "index-runtime-openvino",
        f"{INDEX} faiss:{{out}}/ix --runtime openvino",
        "openvino",
        "runtime 'openvino'",
    ),
    # the stores: each backend's library
    Case("index:qdrant-local", f"{INDEX} qdrant-local:{{out}}/q/docs", "qdrant", "qdrant-client"),
    Case(
        "index:pgvector",
        f"{INDEX} pgvector:postgresql://u@127.0.0.1:9/db#t",
        "pgvector",
        "psycopg",
    ),
    Case("index:milvus", f"{INDEX} milvus:{{out}}/m.db/docs", "milvus", "pymilvus"),
    Case("index:chroma", f"{INDEX} chroma:{{out}}/c/docs", "chroma", "chromadb"),
    Case("index:lancedb", f"{INDEX} lancedb:{{out}}/l/docs", "lancedb", "lancedb"),
    Case("index:scann", f"{INDEX} scann:{{out}}/s", "scann", "scann"),
    Case(
        "search:qdrant",
        "search {export} q --store qdrant:http://127.0.0.1:9/docs",
        "qdrant",
        "qdrant-client",
    ),
    Case(
        "recall:chroma",
        "recall {export} --store chroma:{out}/c/docs --queries {queries}",
        "chroma",
        "chromadb",
    ),
    Case(
        "rescale:lancedb-target",
        "rescale --source faiss:{source} --target lancedb:{out}/l/docs --corpus-prior 0.1",
        "lancedb",
        "lancedb",
    ),
    Case(
        "annotate:qdrant",
        "annotate --store qdrant:http://127.0.0.1:9/docs --corpus-prior 0.1",
        "qdrant",
        "qdrant-client",
    ),
]

#: Runs the CLI with the modules named in argv[1] (comma-separated) blocked.
BLOCKING_CLI = (
    "import sys\n"
    "for name in filter(None, sys.argv.pop(1).split(',')):\n"
    "    sys.modules[name] = None\n"
    "from magretrieve.cli import main\n"
    "sys.exit(main())\n"
)


def run_case(case: Case, paths: dict[str, Path], blocked: tuple[str, ...]) -> None:
    """Run ``case`` in a fresh interpreter with ``blocked`` modules and check its refusal."""
    out = paths["out"]
    out.mkdir(parents=True, exist_ok=True)
    assert not any(out.iterdir())
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKING_CLI, ",".join(blocked), *case.argv(paths)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=out.parent,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr[-3000:]
    assert f"pip install 'magretrieve[{case.extra}]'" in lines[0], lines[0]
    says = case.says.format(**{k: str(v) for k, v in paths.items()})
    assert says in lines[0], f"{says!r} not in {lines[0]!r}"
    assert not any(out.iterdir()), f"{case.id} wrote {sorted(p.name for p in out.iterdir())}"
