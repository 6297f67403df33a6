"""``magretrieve serve EXPORT_DIR [--store SPEC] [--host 127.0.0.1] [--port 8080] [--api-key KEY]``."""

from __future__ import annotations

import signal
import socket
from typing import Any

import click

from magretrieve.cli._common import collect_store_options, search_store_options
from magretrieve.cli._group import main
from magretrieve.cli._options import cli_declared, click_options
from magretrieve.core.errors import ConfigError
from magretrieve.core.redact import redact
from magretrieve.serving.settings import ServerSettings


@main.command("serve")
@click.argument("export_dir", type=click.Path(file_okay=False))
@click.option(
    "--store", "store_spec", default=None, help="Store spec (enables /search, /documents)."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to bind.")
@click.option("--threads", type=int, default=None, help="Intra-op threads of the graphs.")
@click.option("--runtime", default=None, help="Runtime of the graphs (default: the export's).")
@click_options(ServerSettings.declared())
@click.option("--force", is_flag=True, help="Serve a store built by another model.")
@click.option("--access-log", is_flag=True, help="Log every request (uvicorn's access log).")
@search_store_options
def serve_cmd(
    export_dir: str,
    store_spec: str | None,
    host: str,
    port: int,
    threads: int | None,
    runtime: str | None,
    force: bool,
    access_log: bool,
    **options: Any,
) -> None:
    """Serve EXPORT_DIR over HTTP: /v1/embeddings, /embed, /v1/embed (Cohere), /v1/models,
    /info, and with --store /search and /documents. The side is named by the route
    (/query/..., /document/...), the model id (ID:query, ID:document) or the body. Document
    vectors keep their magnitude. Stops cleanly on SIGTERM."""
    # magretrieve.server first: without the server extra it refuses in one line naming it,
    # where importing uvicorn first would end in a traceback
    from magretrieve.server.app import create_app, open_state
    from magretrieve.server.connections import protocol_class
    from magretrieve.server.settings import key_from_env

    # isort: split
    import uvicorn

    given = {o.name: options.pop(o.name) for o in cli_declared(ServerSettings.declared())}
    given["api_key"] = key_from_env(given["api_key"])
    settings = ServerSettings(**given)
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
        **collect_store_options(**options),
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
        http=protocol_class(settings.timeout_response),
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
