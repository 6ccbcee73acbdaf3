"""``rollway view``: a local web page over a run's rollouts, their conversations and tokens."""

from __future__ import annotations

import socket
import threading
import webbrowser
from typing import Annotated

import typer
import uvicorn

from rollway.viewer import RunIndex, create_viewer_app, open_run
from rollway.web.uvicorn_server import ServerLimits, uvicorn_config


def view(
    run: Annotated[
        str,
        typer.Argument(help="An experiment: rollway-runs/<exp_id> or s3://bucket/prefix/<exp_id>."),
    ],
    host: Annotated[
        str, typer.Option(help="Address to serve on; the pages have no key: keep it local.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0: any free port.")] = 0,
    open_browser: Annotated[
        bool, typer.Option("--open/--no-open", help="Open the page in a browser.")
    ] = False,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Tokenizer folder (or cached hub id) to decode tokens with; "
            "default: the run's model's, when it loads offline."
        ),
    ] = None,
) -> None:
    """Serve a page listing the run's rollouts (filter, sort, group statistics) and, for each,
    the conversation and the token stream a trainer sees. Ctrl-C stops it."""
    location = open_run(run)
    index = RunIndex(location)
    # Rows the index lacks (object storage, older runs) are read now, not at the first click.
    threading.Thread(target=index.totals, name="rollway-view-index", daemon=True).start()
    app = create_viewer_app(location, tokenizer=tokenizer, index=index)
    # Bind first: with --port 0 the URL is known only once the OS picked the port.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_socket = socket.create_server((host, port), family=family)
    bound_host, bound_port = server_socket.getsockname()[:2]
    shown_host = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host
    url = f"http://{shown_host}:{bound_port}/"
    typer.echo(f"rollway view: {location.name} on {url}")
    if open_browser:
        webbrowser.open(url)
    config = uvicorn_config(app, ServerLimits(), log_level="warning")
    try:
        uvicorn.Server(config).run(sockets=[server_socket])
    finally:
        server_socket.close()
