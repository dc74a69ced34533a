"""Keys, balances and ledger routes against the runtime's real (embedded SQLite) credit and key stores; and the
``credits_not_enabled`` answer when credits are off."""

from __future__ import annotations

import csv
import io

import pytest

from tests.admin.conftest import Admin


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/admin/keys"), ("GET", "/admin/credits"), ("GET", "/admin/credits/alice"), ("GET", "/admin/ledger"),
    ("GET", "/admin/ledger.csv"), ("DELETE", "/admin/keys/key_1")])
def test_without_credits_routes_say_so(admin: Admin, method: str, path: str) -> None:
    response = admin.request(method, path)
    assert response.status_code == 404 and response.json()["error"]["code"] == "credits_not_enabled"


def test_keys_balances_ledger(credits_admin: Admin) -> None:
    admin = credits_admin
    created = admin.post("/admin/keys", json={"user": "alice", "tenant": "acme", "name": "ci"})
    assert created.status_code == 201
    key = created.json()
    assert key["key"].startswith("rpk_") and key["active"] is True and key["user"] == "alice"
    listed = admin.get("/admin/keys", params={"tenant": "acme"}).json()["keys"]
    assert [k["key_id"] for k in listed] == [key["key_id"]] and "key" not in listed[0]
    assert admin.get("/admin/credits/alice").json()["available"] == "0"
    topped = admin.post("/admin/credits/alice", json={"amount": "12.5", "tenant": "acme", "note": "welcome"})
    assert topped.json() | {} == {"user": "alice", "tenant": "acme", "available_micro": 12_500_000,
                                  "held_micro": 0, "available": "12.5", "held": "0", "balance": "12.5"}
    assert admin.post("/admin/credits/alice", json={"amount": 0}).status_code == 400
    assert admin.get("/admin/credits").json() == {"accounts": [topped.json()], "truncated": False}
    ledger = admin.get("/admin/ledger", params={"user": "alice"}).json()
    assert [(e["kind"], e["amount"], e["amount_credits"]) for e in ledger["entries"]] == [
        ("top_up", 12_500_000, "12.5")]
    assert admin.get("/admin/ledger", params={"kind": "refund"}).status_code == 400
    exported = admin.get("/admin/ledger.csv")
    assert exported.headers["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert [(r["user"], r["kind"], r["amount"], r["note"]) for r in rows] == [("alice", "top_up", "12.5", "welcome")]
    assert admin.delete(f"/admin/keys/{key['key_id']}").json() == {"revoked": key["key_id"]}
    assert admin.delete(f"/admin/keys/{key['key_id']}").status_code == 404
    assert admin.get("/admin/keys").json()["keys"] == []
    assert len(admin.get("/admin/keys", params={"include_revoked": "true"}).json()["keys"]) == 1
