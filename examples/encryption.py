"""Payload encryption with AES-GCM and key rotation: nothing a run handles is readable in Redis.

Shows: a ``KeyRing`` of AES-GCM keys installed as the payload hook, so every argument,
result, signal and error (the activity's error message and traceback too) is encrypted with
the ring's current key, its envelope naming the key id; rotating to a new key while a run is
in flight (the run's older payloads still decode with the old key, new ones use the new key);
and a scan of every Redis key of the namespace that finds no card number in the clear.

Needs the optional ``cryptography`` package (``pip install -e '.[crypto]'`` in durable's checkout).

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/encryption.py

To serve it with real processes, give every process the same keys (current key first)::

    export DURABLE_PAYLOAD_KEYS="2025-01:$(python -c 'import os,base64;print(base64.b64encode(os.urandom(32)).decode())')"
    export DURABLE_PAYLOAD_HOOK=examples.encryption:payload_hook   # the CLI installs it
    durable worker --app examples.encryption                        # importing the app installs it too
    durable start EncryptedPayment '"4111111111111111"' 1250 --id pay-1
    durable describe pay-1                                          # decrypted for display
"""

from __future__ import annotations

import base64
import os
from typing import Any

from durable import (
    ActivityFailed,
    RetryPolicy,
    Workflow,
    WorkflowStub,
    activity,
    await_signal,
    codec,
)

ONCE = RetryPolicy(max_attempts=1)


# ------------------------------------------------------------------- key ring
def payload_hook(spec: str | None = None) -> codec.KeyRing:
    """The key ring described by ``spec`` (default ``$DURABLE_PAYLOAD_KEYS``).

    ``spec`` is ``id:base64key,id:base64key,...``, the current key first; the others only
    decrypt payloads written before a rotation. Keep the keys in your secret store.
    """
    spec = spec if spec is not None else os.environ.get("DURABLE_PAYLOAD_KEYS", "")
    ciphers: dict[str, codec.AesGcm] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key_id, _, key = item.partition(":")
        ciphers[key_id] = codec.AesGcm(base64.b64decode(key))
    if not ciphers:
        raise SystemExit("DURABLE_PAYLOAD_KEYS is empty: set id:base64key[,id:base64key...]")
    return codec.KeyRing(ciphers, current=next(iter(ciphers)))


# A worker importing this app (``--app examples.encryption``) encrypts from its first payload.
if os.environ.get("DURABLE_PAYLOAD_KEYS"):
    codec.set_payload_hook(payload_hook())


# ----------------------------------------------------------------- activities
def authorize_payment(card: str, cents: int) -> str:
    if card.startswith("4000"):
        raise ValueError(f"card {card} declined")  # this message quotes the card: encrypted too
    return f"receipt for {cents} cents on card ending {card[-4:]}"


# ------------------------------------------------------------------- workflow
class EncryptedPayment(Workflow):
    """Charge the card, then wait for the shop's confirmation."""

    def handle(self, card: str, cents: int) -> dict[str, Any]:
        try:
            receipt = activity(authorize_payment, card, cents, retry=ONCE)
        except ActivityFailed as exc:
            return {"status": "declined", "error": str(exc.cause)}
        confirmation = await_signal("confirm", timeout=3600)
        return {"status": "paid", "receipt": receipt, "confirmation": confirmation}


# ----------------------------------------------------------------------- demo
def _stored_bytes(store: Any) -> list[bytes]:
    """Every key name, value, hash field, stream entry, list and set member of the namespace."""
    redis, out = store.redis, []
    for key in redis.scan_iter(match=f"{store.keys.prefix}:*", count=1000):
        kind = redis.type(key)
        out.append(key)
        if kind == b"string":
            out.append(redis.get(key) or b"")
        elif kind == b"hash":
            out += [f + b"=" + v for f, v in redis.hgetall(key).items()]
        elif kind == b"stream":
            out += [f + b"=" + v for _, fields in redis.xrange(key) for f, v in fields.items()]
        elif kind == b"list":
            out += redis.lrange(key, 0, -1)
        elif kind in (b"set", b"zset"):
            out += list(redis.smembers(key)) if kind == b"set" else redis.zrange(key, 0, -1)
    return out


def main(store: Any = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """A paid run that spans a key rotation and a declined one; returns what a reader sees."""
    import uuid

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    old_key, new_key = (base64.b64encode(os.urandom(32)).decode() for _ in range(2))
    before = codec.get_payload_hook()
    codec.set_payload_hook(payload_hook(f"2024-06:{old_key}"))
    load_app([__name__])
    store = store or default_store()
    suffix = uuid.uuid4().hex[:6]
    good, bad = "4111111111111111", "4000000000000002"
    try:
        with WorkerThread(Worker(store, concurrency=4, grace=5.0, block_ms=200)):
            paid = WorkflowStub.make(EncryptedPayment, id=f"pay-ok-{suffix}", store=store).start(good, 1250)
            declined = WorkflowStub.make(EncryptedPayment, id=f"pay-no-{suffix}", store=store).start(bad, 990)
            declined_result = declined.result(timeout=timeout)
            # Rotate: the new key becomes current, the old one stays to read older payloads.
            codec.set_payload_hook(payload_hook(f"2025-01:{new_key},2024-06:{old_key}"))
            paid.signal("confirm", "shipped")
            paid_result = paid.result(timeout=timeout)
        blobs = _stored_bytes(store)
        attempt = declined.describe()["attempts"][0]["record"]
    finally:
        codec.set_payload_hook(before)
    return {
        "paid": paid_result,
        "declined": declined_result,
        "attempt_error": attempt["error"],
        "attempt_error_type": attempt["error_type"],
        "key_ids_in_redis": sorted(
            k for k in ("2024-06", "2025-01") if any(b"DK1\x07" + k.encode() in b for b in blobs)
        ),
        "card_numbers_in_redis": sum(good.encode() in b or bad.encode() in b for b in blobs),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
