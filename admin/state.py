"""What every admin route shares: the runtime's app key and the JSON response helper."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.assembly.runtime import Runtime

RUNTIME = web.AppKey("admin_runtime", Runtime)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS),
                        content_type="application/json")
