"""``/admin/ui`` in headless Chromium against a running proxy: the numbers it shows match ``/admin/stats``, and a
screenshot is saved to ``artifacts/admin-ui.png``.

Needs a Chromium binary (Debian: ``apt-get install chromium``); skipped with that reason when none is found. Marked
``browser``: out of the default run, run by ``.ci/run`` (``scripts/test.sh -m browser``).
Chromium is driven with ``--dump-dom`` (the DOM after the page's scripts ran; ``--virtual-time-budget`` lets its
fetches finish) and ``--screenshot``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from tests.admin.conftest import TOKEN, Admin, ask
from tests.support.proxy_server import ProxyServer

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
                 if (path := shutil.which(name))), None)
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (Debian: apt-get install chromium)")]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--hide-scrollbars", "--virtual-time-budget=10000", "--window-size=1400,1900"]


class ShownValues(HTMLParser):
    """Text of elements with an ``id``, and rows carrying ``data-*`` keys (tier, route, key)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.attrs_by_id: dict[str, dict[str, str | None]] = {}
        self.rows: list[tuple[dict[str, str | None], list[str]]] = []
        self._open: list[str | None] = []
        self._row: tuple[dict[str, str | None], list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self._open.append(found.get("id"))
        if found.get("id"):
            self.by_id[str(found["id"])] = ""
            self.attrs_by_id[str(found["id"])] = found
        if tag == "tr":
            self._row = (found, [])
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row[1].append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        for element in self._open:
            if element:
                self.by_id[element] += data
        if self._cell is not None:
            self._cell.append(data)


def chromium(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[bytes]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, *args], capture_output=True, timeout=timeout)


def test_dashboard_shows_the_stats(admin_proxy: ProxyServer, admin: Admin) -> None:
    for question in ("alpha", "beta", "alpha", "alpha", "gamma"):
        ask(admin_proxy, question)
    ask(admin_proxy, "uncacheable", n=2)
    page = f"{admin_proxy.admin_url}/admin/ui#token={TOKEN}"
    dumped = chromium("--dump-dom", page)
    assert dumped.returncode == 0, dumped.stderr.decode(errors="replace")[-3000:]
    stats = admin.get("/admin/stats").json()  # no data-plane request since the page loaded: same numbers
    shown = ShownValues()
    shown.feed(dumped.stdout.decode())
    assert shown.by_id["status"].startswith("updated"), shown.by_id.get("status")
    total = stats["total"]
    assert shown.by_id["total-requests"] == str(total["requests"]) == "6"
    assert shown.by_id["total-hits"] == str(total["hits"]) == "2"
    assert shown.by_id["total-misses"] == str(total["misses"]) == "3"
    assert shown.by_id["total-bypasses"] == str(total["bypasses"]) == "1"
    assert shown.by_id["hit-ratio"] == f"{100 * total['hit_ratio']:.1f}%" == "40.0%"
    assert shown.by_id["cost-saved"] == f"{stats['cost_saved_s']:.3f} s"
    tier_rows = {row[0].get("data-tier"): row[1] for row in shown.rows if row[0].get("data-tier")}
    l1 = stats["tiers"]["l1"]
    assert tier_rows["l1"][:4] == ["l1", str(l1["entries"]), str(l1["bytes"]), f"{100 * l1['hit_ratio']:.1f}%"]
    top_rows = [row[1] for row in shown.rows if row[0].get("data-key")]
    assert top_rows[0][0] == str(stats["top_entries"][0]["hits"]) == "2"
    assert top_rows[0][3] == stats["top_entries"][0]["key"]
    assert top_rows[0][2] == stats["top_entries"][0]["question"] == "alpha", "an exact hit's row names its question"
    latency_rows = {row[0].get("data-status") for row in shown.rows if row[0].get("data-status")}
    assert latency_rows == set(stats["latency_s"])
    assert "credits are not enabled" in shown.by_id["credits-note"]
    assert json.loads(shown.by_id["knowledge-tree"]) == admin.get("/admin/backends").json()["knowledge_tree"]
    assert "invalidate-form" in shown.by_id

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "admin-ui.png"
    screenshot.unlink(missing_ok=True)
    taken = chromium(f"--screenshot={screenshot}", page)
    assert taken.returncode == 0 and screenshot.stat().st_size > 10_000, taken.stderr.decode(errors="replace")[-2000:]


def test_dashboard_shows_each_key_s_limits_and_usage(credits_proxy: ProxyServer, credits_admin: Admin) -> None:
    created = credits_admin.post("/admin/keys", json={"user": "ann", "tenant": "acme", "rpm_limit": 5,
                                                      "tpm_limit": 5000, "max_budget": "2", "budget_duration": "1d",
                                                      "duration": "30d"}).json()
    assert credits_admin.put("/admin/tenants/acme", json={"rpm_limit": 100}).status_code == 200
    assert credits_admin.post("/admin/credits/ann", json={"amount": 10, "tenant": "acme"}).status_code == 200
    for question in ("one", "two"):
        answer = httpx.post(credits_proxy.url + "/v1/chat/completions", timeout=30,
                            headers={"Authorization": f"Bearer {created['key']}"},
                            json={"model": "fake-model", "max_tokens": 8,
                                  "messages": [{"role": "user", "content": question}]})
        assert answer.status_code == 200, answer.text
    dumped = chromium("--dump-dom", f"{credits_proxy.admin_url}/admin/ui#token={TOKEN}")
    assert dumped.returncode == 0, dumped.stderr.decode(errors="replace")[-3000:]
    shown = ShownValues()
    shown.feed(dumped.stdout.decode())
    rows = {row[0].get("data-scope"): row[1] for row in shown.rows if row[0].get("data-scope")}
    key_row = rows[f"key:{created['key_id']}"]
    assert key_row[1] == "ann @ acme"
    assert key_row[2].endswith(" / 5") and int(key_row[2].split(" / ")[0]) in (1, 2)  # a minute drains 5
    assert key_row[3].endswith(" / 5000")
    assert key_row[4].endswith(" / 2 per 1d") and key_row[6] != "never"
    assert rows["tenant:acme"][2].endswith(" / 100")
    assert "refused since start: " in shown.by_id["limits-note"]
