"""Smoke tests of examples/: each one's main() runs against the test Redis with an in-process worker."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from durable.store.redis_store import RedisStore

EXAMPLES = [
    "saga",
    "approval",
    "fanout",
    "subscription",
    "versioning",
    "hook_callback",
    "children",
    "updates",
    "encryption",
    "order_search",
]
ROOT = Path(__file__).resolve().parent.parent


def _example(name: str):  # type: ignore[no-untyped-def]
    return importlib.import_module(f"examples.{name}")


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_has_a_docstring_saying_how_to_run_it(name: str) -> None:
    module = _example(name)
    assert module.__doc__ and f"python examples/{name}.py" in module.__doc__
    source = (ROOT / "examples" / f"{name}.py").read_text()
    assert 'if __name__ == "__main__":' in source
    # only the public API on the workflow side
    for line in source.splitlines():
        if line.startswith(("from durable", "import durable")):
            assert line.startswith("from durable import"), line


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_passes_the_determinism_lint(name: str) -> None:
    from workers.cli import cli

    result = CliRunner().invoke(cli, ["check", "--app", f"examples.{name}"])
    assert result.exit_code == 0, result.output


def test_saga(store: RedisStore) -> None:
    result = _example("saga").main(store, timeout=30)
    assert result["ok"]["status"] == "shipped"
    failed = result["failed"]
    assert failed["status"] == "compensated"
    assert "nowhere" in failed["error"]
    assert [u.split()[0] for u in failed["undone"]] == ["refunded", "released"]  # newest first


def test_approval(store: RedisStore) -> None:
    result = _example("approval").main(store, timeout=30)
    assert result["approved"]["outcome"] == "approved by alice"
    assert result["approved"]["comments"] == ["receipts attached"]
    assert result["late"]["outcome"] == "timed out"


def test_updates(store: RedisStore) -> None:
    result = _example("updates").main(store, timeout=30)
    assert result["sizes"] == [1, 2, 2]
    assert result["rejected"] == "'milk' is empty or already in the cart"
    assert result["reserved"] == ["milk", "tea"]
    assert result["cart"]["items"] == {"milk": "reservation-milk", "tea": "reservation-tea"}
    assert result["cart"]["notes"] == ["leave at the door"]


def test_order_search(store: RedisStore) -> None:
    result = _example("order_search").main(store, timeout=30)
    assert [r["ok"] for r in result["results"]] == [["a1: ok", "b3: ok"]] * 3
    [problem] = result["results"][0]["problems"]
    assert "ValueError: x2 is discontinued" in problem
    assert result["big_acme"] == [result["first"]]
    assert result["paid"] == 3
    assert result["restarted"] is False


def test_fanout(store: RedisStore) -> None:
    result = _example("fanout").main(store, timeout=30, items=50, chunk_size=7)
    assert result["chunks"] == 8
    assert result["total"] == {"count": 50, "sum_of_squares": sum(x * x for x in range(1, 51))}


def test_subscription(store: RedisStore) -> None:
    result = _example("subscription").main(store, timeout=30, periods=4)
    assert result["periods"] == 4
    assert result["runs"] == 2  # 3 periods per run, then continue_as_new
    assert result["first_run"] != result["last_run"]


def test_versioning(store: RedisStore) -> None:
    result = _example("versioning").main(store, timeout=30)
    assert result["old_run"]["welcome"].startswith("email")
    assert result["new_run"] == {"user": "grace", "welcome": "sms to grace", "gift": "gift for grace"}
    assert result["old_history_on_new_code"] == "completed"
    assert result["old_history_on_unsafe_code"].startswith("diverged")


def test_hook_callback(store: RedisStore) -> None:
    result = _example("hook_callback").main(store, timeout=30)
    assert result == {
        "order_id": "order-7",
        "status": "paid",
        "fulfilment": "fulfilled order-7 (paid: psp-991)",
    }


def test_children(store: RedisStore) -> None:
    result = _example("children").main(store, timeout=30)
    by_user = {a["user"]: a for a in result["accounts"]}
    assert by_user["ada"]["grants"] == ["uid-ada@wiki", "uid-ada@git"]
    assert "deny list" in by_user["mallory"]["error"]
    assert result["announcement"] == "#data: welcome ada, grace!"


@pytest.mark.skipif(
    importlib.util.find_spec("cryptography") is None, reason="needs the optional 'cryptography'"
)
def test_encryption(store: RedisStore) -> None:
    result = _example("encryption").main(store, timeout=30)
    assert result["paid"] == {
        "status": "paid",
        "receipt": "receipt for 1250 cents on card ending 1111",
        "confirmation": "shipped",
    }
    assert result["declined"] == {"status": "declined", "error": "card 4000000000000002 declined"}
    assert result["attempt_error"] == "ValueError: card 4000000000000002 declined"
    assert result["attempt_error_type"] == "ValueError"
    assert result["key_ids_in_redis"] == ["2024-06", "2025-01"]  # payloads from before and after the rotation
    assert result["card_numbers_in_redis"] == 0
