"""``python -m loadtest.bench instructions [--quick] [--json]``: CPU instructions the proxy spends per request.

The request of the ``overhead`` benchmark (a one-message chat completion, caches off; with ``--hits``, L1 on, so
every measured request is an exact hit: what keying and answering from L1 cost) is sent one at a time to
``ragproxy serve`` and to :mod:`loadtest.bare_forwarder` (the floor: the proxy's own server and forwarding client
with nothing between them), each running under valgrind's callgrind. Counting starts after a warm-up and stops
after the measured requests; the figure is user-space instructions per request (system calls' kernel time is not
counted).

With ``strace`` installed, the same requests are also sent to each program running normally, with ``strace -c``
attached, for the system calls per request: at concurrency 1 each one is kernel time on the request's path that
the instruction count does not see.

Why this benchmark next to ``overhead``: on a shared machine, throughput and CPU time per request move by 10-20%
from one run to the next, more than most single changes to the hot path are worth. Instruction counts repeat to
within about 1%, so a change can be judged in one run; ``overhead`` then says what it buys in time. Needs
``valgrind`` (``apt-get install valgrind``); a run takes about a minute. valgrind lacks AVX-512: where pip built
hnswlib from source for such a CPU, rebuild it portable first (``HNSWLIB_NO_NATIVE=1 pip install --force-reinstall
--no-deps --no-binary hnswlib hnswlib``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from loadtest.harness import child, free_port, wait_for_port

BODY = b'{"model":"bench","messages":[{"role":"user","content":"What does a proxy do?"}]}'
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
           b"Accept: */*\r\nUser-Agent: bench\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY))


async def _send(port: int, count: int) -> None:
    """``count`` requests, one at a time, on one keep-alive connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(count):
            writer.write(REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:40]!r}")
            start = head.lower().index(b"content-length:") + len(b"content-length:")
            await reader.readexactly(int(head[start:head.index(b"\r\n", start)]))
    finally:
        writer.close()


def _instructions(args: list[str], port: int, env: dict[str, str], warm: int, count: int) -> float:
    """Instructions per request of the Python program ``args`` listening on ``port``."""
    with tempfile.TemporaryDirectory() as out:
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={out}/callgrind.out", sys.executable, *args]
        log = Path(out, "valgrind.log")
        with log.open("wb") as stderr:
            process = subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            try:
                wait_for_port(port, timeout=300, process=process)  # start-up under valgrind is slow
            except RuntimeError:
                tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
                raise RuntimeError("the program died under valgrind:\n" + "\n".join(tail)) from None
            asyncio.run(_send(port, warm))
            subprocess.run(["callgrind_control", "--instr=on", str(process.pid)], check=True, capture_output=True)
            asyncio.run(_send(port, count))
            subprocess.run(["callgrind_control", "--instr=off", str(process.pid)], check=True, capture_output=True)
        finally:
            process.terminate()
            process.wait(timeout=120)
        totals = [int(line.split()[1]) for line in
                  Path(out, "callgrind.out").read_text(encoding="utf-8", errors="replace").splitlines()
                  if line.startswith(("totals:", "summary:"))]
    if not totals or not totals[-1]:
        raise RuntimeError("callgrind counted nothing")
    return totals[-1] / count  # the file's last total ("summary:" may come first, as 0)


def _system_calls(args: list[str], port: int, env: dict[str, str], warm: int, count: int) -> float:
    """System calls per request of the Python program ``args`` listening on ``port`` (all its threads)."""
    with tempfile.TemporaryDirectory() as out:
        process = subprocess.Popen([sys.executable, *args], env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port, timeout=60, process=process)
            asyncio.run(_send(port, warm))
            tracer = subprocess.Popen(["strace", "-c", "-f", "-o", f"{out}/counts", "-p", str(process.pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            assert tracer.stderr is not None
            for line in tracer.stderr:  # "strace: Process N attached" once per thread, after the main one
                if "attached" in line:
                    break
            asyncio.run(_send(port, count))
            tracer.send_signal(signal.SIGINT)
            tracer.communicate(timeout=30)
        finally:
            process.terminate()
            process.wait(timeout=30)
        total = next(line.split() for line in Path(out, "counts").read_text().splitlines()
                     if line.rstrip().endswith(" total"))
    return int(total[3]) / count  # % time, seconds, usecs/call, calls, [errors,] "total"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench instructions")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--hits", action="store_true", help="L1 on: every measured request is an exact hit")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("this benchmark needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    warm, count = (200, 300) if args.quick else (500, 1000)
    upstream_port = free_port()
    with child(["-m", "loadtest.trivial_upstream", "--port", str(upstream_port)], upstream_port):
        upstream = f"http://127.0.0.1:{upstream_port}"
        proxy_port, floor_port = free_port(), free_port()
        proxy_env = {"RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": upstream}]), "RAGPROXY_CACHE__ENABLED": "false",
                     "RAGPROXY_ADMIN__ENABLED": "false", "RAGPROXY_SERVER__PORT": str(proxy_port),
                     "RAGPROXY_LOGGING__LEVEL": "warning"}
        if args.hits:  # L1 alone, nothing written to disk: the warm-up's first request stores, the rest are hits
            proxy_env.update({"RAGPROXY_CACHE__ENABLED": "true", "RAGPROXY_CACHE__L2__ENABLED": "false",
                              "RAGPROXY_CACHE__L3__ENABLED": "false",
                              "RAGPROXY_DATA_DIR": tempfile.mkdtemp(prefix="ragproxy-instructions-")})
        proxy_args = ["-m", "commands.cli", "serve"]
        floor_args = ["-m", "loadtest.bare_forwarder", "--port", str(floor_port), "--upstream", upstream]
        proxy = _instructions(proxy_args, proxy_port, proxy_env, warm, count)
        floor = _instructions(floor_args, floor_port, {}, warm, count)
        results = {"proxy_instructions_per_request": proxy, "floor_instructions_per_request": floor,
                   "proxy_to_floor": proxy / floor, "proxy_over_floor_instructions": proxy - floor}
        if shutil.which("strace") is not None:
            results["proxy_syscalls_per_request"] = _system_calls(proxy_args, proxy_port, proxy_env, warm, count)
            results["floor_syscalls_per_request"] = _system_calls(floor_args, floor_port, {}, warm, count)
        else:
            print("strace not found: no system call counts", file=sys.stderr)
    for key, value in results.items():
        print(f"{key:32s} {value:14,.2f}")
    if args.json:
        print(json.dumps({k: round(v, 3) for k, v in results.items()}))
    return 0
