"""The ceiling for any Python proxy: a raw ASGI app under uvicorn (httptools) that forwards each
request body to the upstream's /v1/chat/completions over one pooled aiohttp session and returns
the upstream's bytes untouched. No parsing, routing, auth or recording.

Usage: python benchmarks/bare_proxy.py --upstream http://127.0.0.1:PORT --port PORT
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn

JSON = [(b"content-type", b"application/json")]
FORWARDED = {"Content-Type": "application/json"}


class BareProxy:
    def __init__(self, upstream: str) -> None:
        self.url = f"{upstream.rstrip('/')}/v1/chat/completions"
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http" and self.session is not None:
            body, more = b"", True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            async with self.session.post(self.url, data=body, headers=FORWARDED) as upstream:
                payload = await upstream.read()
            await send({"type": "http.response.start", "status": upstream.status, "headers": JSON})
            await send({"type": "http.response.body", "body": payload})

    async def lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # Created here, inside uvicorn's event loop; no cap on pooled connections.
                self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="http://HOST:PORT of the server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = BareProxy(args.upstream)
    uvicorn.run(
        app, host=args.host, port=args.port, http="httptools", log_level="warning", access_log=False
    )


if __name__ == "__main__":
    main()
