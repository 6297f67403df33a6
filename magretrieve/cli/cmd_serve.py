"""``magretrieve serve EXPORT_DIR [--store SPEC] [--host 127.0.0.1] [--port 8080] [--api-key KEY]``."""

from __future__ import annotations

import signal
import socket

import click

from magretrieve.cli._common import collect_store_options, search_store_options
from magretrieve.cli._group import main
from magretrieve.core.batching import DEFAULT_BATCH_TOKENS
from magretrieve.core.env import API_KEY_ENV
from magretrieve.core.errors import ConfigError
from magretrieve.core.redact import redact


@main.command("serve")
@click.argument("export_dir", type=click.Path(file_okay=False))
@click.option(
    "--store", "store_spec", default=None, help="Store spec (enables /search, /documents)."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to bind.")
@click.option(
    "--api-key",
    default=None,
    help=f"Bearer key for every route but /health /ready /info /metrics; turns the write "
    f"endpoints on. Prefer ${API_KEY_ENV} (a flag shows in the process list).",
)
@click.option("--threads", type=int, default=None, help="Intra-op threads of the graphs.")
@click.option("--runtime", default=None, help="Runtime of the graphs (default: the export's).")
@click.option(
    "--max-batch-tokens",
    type=int,
    default=DEFAULT_BATCH_TOKENS,
    show_default=True,
    help="Padded-token budget of one merged batch.",
)
@click.option("--max-batch-rows", type=int, default=64, show_default=True, help="Texts per batch.")
@click.option(
    "--max-wait-ms",
    type=float,
    default=2.0,
    show_default=True,
    help="How long a request waits for others to join its batch.",
)
@click.option("--no-batching", is_flag=True, help="Encode every request on its own.")
@click.option(
    "--max-queue", type=int, default=512, show_default=True, help="Waiting requests before 503."
)
@click.option(
    "--max-inputs",
    type=int,
    default=2048,
    show_default=True,
    help="Texts per request (OpenAI's limit; still encoded in batches of --max-batch-tokens).",
)
@click.option(
    "--model-id",
    default=None,
    help="Served model id: GET /v1/models lists ID:query and ID:document, which name the "
    "side (default: the export folder's name).",
)
@click.option(
    "--max-text-chars", type=int, default=32_768, show_default=True, help="Characters per text."
)
@click.option(
    "--onnx-spinning/--no-onnx-spinning",
    default=True,
    show_default=True,
    help="Let onnxruntime's threads spin-wait between runs (fastest on cores of its own; "
    "--no-onnx-spinning where a database or other replicas share the cores).",
)
@click.option(
    "--graph-workers",
    type=int,
    default=2,
    show_default=True,
    help="Batches run at once, each on --threads / N intra-op threads (a batch alone "
    "runs on all of them).",
)
@click.option(
    "--limit-concurrency",
    type=int,
    default=1024,
    show_default=True,
    help="Open connections and running requests before new requests get 503 (/health "
    "always answers).",
)
@click.option(
    "--timeout-keep-alive",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds a connection may wait without sending a complete request before it is "
    "closed (idle after an answer, or slow to send its headers).",
)
@click.option(
    "--recall-sample",
    type=click.FloatRange(0.0, 1.0),
    default=0.01,
    show_default=True,
    help="Share of /search queries re-run exactly in the background for the live recall@10 "
    "gauge (/metrics, /info); 0 turns it off.",
)
@click.option("--force", is_flag=True, help="Serve a store built by another model.")
@click.option("--access-log", is_flag=True, help="Log every request (uvicorn's access log).")
@search_store_options
def serve_cmd(
    export_dir: str,
    store_spec: str | None,
    host: str,
    port: int,
    api_key: str | None,
    threads: int | None,
    runtime: str | None,
    max_batch_tokens: int,
    max_batch_rows: int,
    max_wait_ms: float,
    no_batching: bool,
    max_queue: int,
    max_inputs: int,
    model_id: str | None,
    max_text_chars: int,
    onnx_spinning: bool,
    graph_workers: int,
    limit_concurrency: int,
    timeout_keep_alive: float,
    recall_sample: float,
    force: bool,
    access_log: bool,
    **store_kw: object,
) -> None:
    """Serve EXPORT_DIR over HTTP: /v1/embeddings, /embed, /v1/embed (Cohere), /v1/models,
    /info, and with --store /search and /documents. The side is named by the route
    (/query/..., /document/...), the model id (ID:query, ID:document) or the body. Document
    vectors keep their magnitude. Stops cleanly on SIGTERM."""
    # without the server extra, importing magretrieve.server refuses in one line naming it
    import uvicorn

    from magretrieve.server.app import create_app, open_state
    from magretrieve.server.connections import protocol_class
    from magretrieve.server.settings import ServerSettings, key_from_env

    settings = ServerSettings(
        api_key=key_from_env(api_key),
        max_inputs=max_inputs,
        model_id=model_id,
        max_text_chars=max_text_chars,
        max_batch_tokens=max_batch_tokens,
        max_batch_rows=max_batch_rows,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        batching=not no_batching,
        onnx_spinning=onnx_spinning,
        graph_workers=graph_workers,
        limit_concurrency=limit_concurrency,
        timeout_keep_alive=timeout_keep_alive,
        recall_sample=recall_sample,
    )
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads {threads}: must be at least 1 (intra-op threads)")
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port}: not a TCP port (1..65535)")
    listener = _listen(host, port)  # before anything is loaded: a taken port fails at once
    state = open_state(
        export_dir,
        store_spec,
        settings=settings,
        threads=threads,
        runtime=runtime,
        force=force,
        **collect_store_options(**store_kw),
    )
    app = create_app(state=state)
    writes = "on" if settings.writes_enabled and store_spec else "off"
    click.echo(
        f"serving {export_dir} on http://{host}:{port} (store: {redact(store_spec or 'none')}, "
        f"writes {writes}, models {state.model_id}:query and {state.model_id}:document, "
        "docs at /docs)",
        err=True,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=access_log,
        timeout_graceful_shutdown=30,
        server_header=False,
        http=protocol_class(),
        limit_concurrency=settings.limit_concurrency,
        timeout_keep_alive=settings.timeout_keep_alive,  # type: ignore[arg-type]
    )
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal under the handler that was
    # there before it: make that one a clean exit, so a drained server exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    uvicorn.Server(config).run(sockets=[listener])


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port``, or one line saying why it cannot be."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(
            f"--host {host!r}: not an address this machine can listen on ({exc})"
        ) from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"--host {host} --port {port}: cannot listen there ({exc.strerror})"
        ) from None
    return sock


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)
