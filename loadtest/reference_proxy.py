"""nginx as a reference reverse proxy for the overhead benchmark: what a proxy written in C adds on this machine.

:func:`nginx_proxy` starts the machine's ``nginx`` (``apt-get install nginx-light``) in the foreground as one
process (``master_process off``, one worker's work, as ``ragproxy serve`` is one process), forwarding everything
to ``upstream`` over pooled keep-alive HTTP/1.1 connections with buffering off (streams are relayed as they come,
as ragproxy relays them). No caching, no header work beyond nginx's own: it marks the lowest cost of a hop through a
proxy process on the machine at hand, below the floor of a Python proxy (:mod:`loadtest.bare_forwarder`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loadtest.harness import listening

CONFIG = """\
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log error;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream backend {{ server {upstream}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def nginx_available() -> bool:
    return shutil.which("nginx") is not None


@contextmanager
def nginx_proxy(port: int, upstream: str) -> Iterator[subprocess.Popen[bytes]]:
    """nginx on ``127.0.0.1:port`` in front of ``upstream`` (``host:port``); stopped on exit."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder, "nginx.conf")
        config.write_text(CONFIG.format(dir=folder, upstream=upstream, port=port), encoding="utf-8")
        with listening(["nginx", "-c", str(config), "-p", folder], port) as process:
            yield process
