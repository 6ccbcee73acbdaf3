"""The weights a vLLM server holds, as one ``VLLMEngine`` knows them: a checkpoint folder
checked, then loaded (``reload_weights``, a prefix-cache reset, the label); the last load given
again after a restart; weights another client pushed refused. Over ``VLLMControl``, the
server's info and control routes (dev mode's, for the weight-sync ones)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from rollway.engines.remote.connection import RemoteClient
from rollway.engines.remote.vllm_wire import WEIGHT_INFO_SINCE, VLLMServer
from rollway.engines.remote.weight_folders import check_weights_folder, tied_embedding_changed
from rollway.errors import ConfigError, EngineConnectError, EngineError

log = logging.getLogger(__name__)

_DEV_MODE = "start vLLM with VLLM_SERVER_DEV_MODE=1 (its weight-sync routes are dev routes)"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Why a CPU server cannot take a new tied embedding by ``reload_weights`` (vLLM 0.32).
_STALE_TIED_OUTPUT = (
    "{folder} changes the token embedding, which this model ties to its output layer; vLLM's "
    "CPU build computes that layer from a copy packed at start-up (oneDNN, "
    "dispatch_cpu_unquantized_gemm) that reload_weights does not refresh, so its logprobs "
    "would be up to 1e-2 off the new weights'. Keep the embedding frozen in training, or "
    "restart the server on the new folder"
)
#: Why a new engine does not sample from weights another client pushed.
_FOREIGN_WEIGHTS = (
    "vLLM at {url} serves weights labelled {label!r}, pushed before this engine connected, not "
    "its start-up weights: its tokens would be stamped version 0 by weights that are not. Push "
    "this run's weights first (update_weights), or restart the server"
)


class VLLMControl:
    """A vLLM server's GET routes that describe it and POST routes that steer it."""

    def __init__(self, base_url: str, http: RemoteClient, timeout_s: float) -> None:
        self.base_url = base_url
        self.http = http
        self.timeout_s = timeout_s  # for the GET routes; a POST waits as long as it takes

    async def get_json(self, path: str) -> Any:
        """The JSON answer of ``GET path``; None when not 200 or not JSON. Unreachable is an
        ``EngineConnectError``: nothing was sent for the turn yet, another server may take it."""
        url = f"{self.base_url}{path}"
        try:
            answer = await self.http.call(
                "GET", url, timeout_s=self.timeout_s, retry_connect=False, repeatable=True
            )
        except EngineConnectError:
            raise
        except EngineError as exc:
            raise EngineConnectError(f"cannot reach {url}: {exc}") from exc
        return answer.body if answer.status == 200 else None

    async def post(
        self,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        payload: Any = None,
        repeatable: bool = False,
    ) -> Any:
        """POST a control route; its JSON answer, None for an empty body."""
        url = f"{self.base_url}{path}" + (f"?{urlencode(params)}" if params else "")
        answer = await self.http.call("POST", url, payload, repeatable=repeatable)
        if answer.status == 404:
            raise ConfigError(f"{url} answered 404: {_DEV_MODE}", "engine")
        if answer.status >= 400:
            raise EngineError(f"vLLM {path} failed: HTTP {answer.status} {answer.text!r}")
        return answer.body


class ServedWeights:
    """The folder last loaded (``last_load``, given again after a restart) and whether the
    server was seen serving its start-up weights. ``loading`` serializes a load and a
    restart check."""

    def __init__(self, control: VLLMControl) -> None:
        self.control = control
        self.last_load: str | None = None
        self.loading = asyncio.Lock()
        self._checking: asyncio.Future[bool] | None = None
        self._start_weights_seen = False

    async def check_folder(self, path: str, server: VLLMServer) -> None:
        """Refuse (``ConfigError``) a folder the server would fail to load, where this machine
        sees it as the server will: the server is on this machine, or the folder is."""
        on_cpu = await self._on_cpu()
        await asyncio.to_thread(self._check_folder, path, server, on_cpu)

    async def load(self, path: str, version: int, server: VLLMServer) -> None:
        """Load the folder as ``version``: reload, reset the prefix cache, label (>= 0.33)."""
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": path}}
        await self.control.post("/collective_rpc", payload=rpc)
        reset = await self.control.post("/reset_prefix_cache", params={"reset_running_requests": 1})
        if isinstance(reset, dict) and reset.get("success") is False:
            raise EngineError(
                f"vLLM loaded {path} but could not reset its prefix cache (blocks still held); "
                "call update_weights again"
            )
        if server.since(WEIGHT_INFO_SINCE):
            await self.control.post("/update_weight_version", payload={"new_version": str(version)})
        self.last_load = path

    async def caught_up(self, server: VLLMServer, version: int) -> bool:
        """Once weights were pushed: the server still serves ``version``, or is given it
        again (it restarted: True). Before: it serves its start-up weights (asked once), not
        weights another client pushed. One check runs at a time; concurrent callers share it."""
        if not server.since(WEIGHT_INFO_SINCE):
            return False
        if self.last_load is None and self._start_weights_seen:
            return False
        if self._checking is None or self._checking.done():
            self._checking = asyncio.ensure_future(self._check_served(server, version))
        return await asyncio.shield(self._checking)

    def close(self) -> None:
        if self._checking is not None:
            self._checking.cancel()

    async def _check_served(self, server: VLLMServer, version: int) -> bool:
        async with self.loading:
            info = await self.control.get_json("/weight_info")
            label = info.get("weight_version") if isinstance(info, dict) else None
            if self.last_load is None:  # nothing pushed yet: it must serve its own weights
                if label not in (None, "default"):
                    url = self.control.base_url
                    raise EngineError(_FOREIGN_WEIGHTS.format(url=url, label=label))
                self._start_weights_seen = True
                return False
            if label is None or label == str(version):
                return False  # caught up, or it does not say
            await self._reload(self.last_load, version, server, label)
            return True

    async def _reload(self, path: str, version: int, server: VLLMServer, label: str) -> None:
        url = self.control.base_url
        log.warning(
            "vLLM at %s serves weights %r, not version %d (it restarted): loading %s again",
            *(url, label, version, path),
            extra={"stage": "weights", "version": version},
        )
        try:
            await self.load(path, version, server)
        except EngineError as exc:
            raise EngineError(
                f"vLLM at {url} restarted with its start-up weights; loading version "
                f"{version} from {path} again failed: {exc}"
            ) from exc

    def _check_folder(self, path: str, server: VLLMServer, on_cpu: bool) -> None:
        folder = Path(path)
        if urlsplit(self.control.base_url).hostname not in _LOOPBACK and not folder.exists():
            return
        held = self.last_load or server.root  # what the server holds now
        check_weights_folder(folder, Path(server.root) if server.root else None)
        if on_cpu and held is not None and tied_embedding_changed(folder, Path(held)):
            raise ConfigError(_STALE_TIED_OUTPUT.format(folder=path), "source")

    async def _on_cpu(self) -> bool:
        """Whether the server runs vLLM's CPU build (dev mode's ``/server_info``; False when
        it does not say)."""
        try:
            info = await self.control.get_json("/server_info?config_format=json")
        except EngineError:
            return False
        config = info.get("vllm_config") if isinstance(info, dict) else None
        device = config.get("device_config") if isinstance(config, dict) else None
        return isinstance(device, dict) and device.get("device") == "cpu"
