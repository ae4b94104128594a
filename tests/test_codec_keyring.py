"""The KeyRing payload hook: key id in the envelope, rotation, AES-GCM, no plaintext in Redis."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from apps.payments import Joins, SecretEcho
from scenarios import park_queued_task

from durable import AsyncWorkflowStub, WorkflowBlocked, WorkflowFailed, WorkflowStub, codec
from durable.codec import sealed as sealed_text
from durable.errors import ConfigurationError, SerializationError

needs_cryptography = pytest.mark.skipif(
    importlib.util.find_spec("cryptography") is None,
    reason="the AES-GCM example needs the optional 'cryptography' package (pip install cryptography)",
)


class Xor:
    """A toy cipher (not secure) so the ring logic is tested without cryptography."""

    def __init__(self, key: int) -> None:
        self.key = key

    def encrypt(self, data: bytes, aad: bytes) -> bytes:
        return aad + bytes(b ^ self.key for b in data)

    def decrypt(self, data: bytes, aad: bytes) -> bytes:
        if not data.startswith(aad):
            raise ValueError("aad mismatch")
        return bytes(b ^ self.key for b in data[len(aad) :])


@pytest.fixture
def no_hook() -> Iterator[None]:
    yield
    codec.set_payload_hook(None)


def test_envelope_names_the_key_and_rotation_keeps_old_payloads_readable(no_hook: None) -> None:
    codec.set_payload_hook(codec.KeyRing({"k1": Xor(1)}, current="k1"))
    old = codec.dumps({"card": "4111"})
    assert old.startswith(b"DK1\x02k1") and b"4111" not in old
    codec.set_payload_hook(codec.KeyRing({"k1": Xor(1), "k2": Xor(2)}, current="k2"))
    new = codec.dumps({"card": "4111"})
    assert new.startswith(b"DK1\x02k2")
    assert codec.loads(old) == codec.loads(new) == {"card": "4111"}
    assert codec.canonical(old) == codec.canonical(new)
    codec.set_payload_hook(codec.KeyRing({"k2": Xor(2)}, current="k2"))
    with pytest.raises(SerializationError, match=r"key id 'k1', which is not in the key ring \['k2'\]"):
        codec.loads(old)


def test_plaintext_and_tampering(no_hook: None) -> None:
    plain = codec.dumps([1, 2])
    codec.set_payload_hook(codec.KeyRing({"k": Xor(3)}, current="k"))
    with pytest.raises(SerializationError, match="not encrypted by a KeyRing"):
        codec.loads(plain)
    codec.set_payload_hook(codec.KeyRing({"k": Xor(3)}, current="k", accept_plaintext=True))
    assert codec.loads(plain) == [1, 2]
    with pytest.raises(ValueError, match="not in the ring"):
        codec.KeyRing({"k": Xor(3)}, current="other")


@needs_cryptography
def test_aes_gcm_round_trip_and_authentication(no_hook: None) -> None:
    ring = codec.KeyRing({"2025-01": codec.AesGcm(os.urandom(32))}, current="2025-01")
    codec.set_payload_hook(ring)
    data = codec.dumps({"card": "4111 1111 1111 1111"})
    assert b"4111" not in data
    assert codec.loads(data) == {"card": "4111 1111 1111 1111"}
    assert codec.dumps("x") != codec.dumps("x")  # random nonce; canonical bytes still equal
    tampered = data[:-1] + bytes((data[-1] ^ 1,))
    with pytest.raises(SerializationError, match="does not decrypt: InvalidTag"):
        codec.loads(tampered)
    forged_key_id = data.replace(b"2025-01", b"2025-02", 1)
    with pytest.raises(SerializationError, match="not in the key ring"):
        codec.loads(forged_key_id)


def _all_redis_bytes(client: redis.Redis) -> Iterator[bytes]:
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        yield key
        if kind == b"string":
            yield client.get(key) or b""
        elif kind == b"hash":
            for field, value in client.hgetall(key).items():
                yield field + b"=" + value
        elif kind == b"stream":
            for _, fields in client.xrange(key):
                yield from (f + b"=" + v for f, v in fields.items())
        elif kind == b"list":
            yield from client.lrange(key, 0, -1)
        elif kind == b"set":
            yield from client.smembers(key)
        elif kind == b"zset":
            yield from client.zrange(key, 0, -1)


@needs_cryptography
def test_no_payload_plaintext_in_redis_after_a_run(
    worker: Any, redis_client: redis.Redis, no_hook: None
) -> None:
    codec.set_payload_hook(codec.KeyRing({"k": codec.AesGcm(os.urandom(32))}, current="k"))
    secret = "4111-1111-1111-1111-secret"
    assert WorkflowStub.make(SecretEcho).start(secret).result(timeout=15) == secret
    leaks = [blob for blob in _all_redis_bytes(redis_client) if secret.encode() in blob]
    assert leaks == []


CARD = "4111111111111111"


@needs_cryptography
def test_activity_errors_and_tracebacks_are_encrypted_and_describe_decodes_them(
    worker: Any, redis_client: redis.Redis, no_hook: None
) -> None:
    """The attempt log (error message, traceback) and the failure go through the key ring."""
    from apps.sealed import ChargeCard  # noqa: PLC0415 - the app module registers on import

    codec.set_payload_hook(codec.KeyRing({"k": codec.AesGcm(os.urandom(32))}, current="k"))
    stub = WorkflowStub.make(ChargeCard).start(CARD)
    with pytest.raises(WorkflowFailed):
        stub.result(timeout=15)
    leaks = [blob for blob in _all_redis_bytes(redis_client) if CARD.encode() in blob]
    assert leaks == []
    info = stub.describe()
    attempts = info["attempts"]
    assert [a["outcome"] for a in attempts] == ["retry", "failed"]
    for attempt in attempts:
        record = attempt["record"]
        assert record["error"] == f"ValueError: card {CARD} declined"
        assert CARD in record["traceback"] and record["error_type"] == "ValueError"
    assert info.outcome is not None and CARD in (info.outcome.error_message or "")
    # A process without the key still reads what operators need, and a placeholder.
    codec.set_payload_hook(None)
    record = stub.describe()["attempts"][0]["record"]
    assert record["error_type"] == "ValueError" and record["error"].startswith("<sealed text:")


@needs_cryptography
def test_parked_and_blocked_reasons_are_encrypted(
    store: Any, redis_client: redis.Redis, no_hook: None
) -> None:
    """A dead letter's reason and a run's blocked reason may quote user data: sealed too,
    the blocked kind stays readable, and `repair --drop-input` keeps the reason sealed."""
    from apps.sealed import AwaitCard  # noqa: PLC0415

    codec.set_payload_hook(codec.KeyRing({"k": codec.AesGcm(os.urandom(32))}, current="k"))
    stub = WorkflowStub.make(AwaitCard, store=store).start()  # no worker: the task stays queued
    stub.signal("card", CARD)
    reason = f"SerializationError: cannot decode <Card>: bad card {CARD}"
    park_queued_task(store, stub, reason, input_at=1)
    ref = store.ref(stub.id)
    blocked = stub.blocked()
    assert blocked is not None and blocked.kind == "parked_input" and blocked.message == reason
    # result() reads the sealed reason too (it used to fail decoding it as UTF-8, killing the
    # process's waiter thread: every later result() hung), sync and async.
    with pytest.raises(WorkflowBlocked) as info:
        stub.result(timeout=5)
    assert info.value.reason == reason
    with pytest.raises(WorkflowBlocked):
        asyncio.run(_async_result(stub.id, store))
    assert [d["reason"] for d in store.dead_letters()] == [reason]
    store.repair(stub.id, drop_input=True)
    assert store.log_entries(ref)[-1]["reason"] == f"dropped by durable repair: {reason}"
    assert [blob for blob in _all_redis_bytes(redis_client) if CARD.encode() in blob] == []
    stub.terminate("test over")


async def _async_result(workflow_id: str, store: Any) -> Any:
    stub = await AsyncWorkflowStub.load(workflow_id, store=store)
    return await stub.result(timeout=5)


@needs_cryptography
def test_cli_installs_the_hook_named_by_the_environment(
    worker: Any, redis_url: str, no_hook: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`durable describe` (a real process) decrypts with $DURABLE_PAYLOAD_HOOK; without it,
    operators still see the error type, and the message only as sealed text."""
    from apps.sealed import ChargeCard  # noqa: PLC0415

    from examples.encryption import payload_hook  # noqa: PLC0415

    keys = f"k:{base64.b64encode(os.urandom(32)).decode()}"
    codec.set_payload_hook(payload_hook(keys))
    stub = WorkflowStub.make(ChargeCard).start(CARD)
    with pytest.raises(WorkflowFailed):
        stub.result(timeout=15)
    root = Path(__file__).resolve().parent.parent

    def describe(**env: str) -> str:
        full = {**os.environ, "DURABLE_REDIS_URL": redis_url, **env}
        done = subprocess.run(
            [sys.executable, "-m", "workers.cli", "describe", stub.id],
            cwd=root,
            env=full,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    shown = describe(DURABLE_PAYLOAD_KEYS=keys, DURABLE_PAYLOAD_HOOK="examples.encryption:payload_hook")
    assert f"card {CARD} declined" in shown.replace("\n", " ") or CARD in shown
    monkeypatch.delenv("DURABLE_PAYLOAD_HOOK", raising=False)
    hidden = describe()
    assert CARD not in hidden and "ValueError: <sealed text" in hidden
    assert "this process has no payload hook" in hidden  # the run's error, a payload
    bad = subprocess.run(
        [sys.executable, "-m", "workers.cli", "describe", stub.id],
        cwd=root,
        env={**os.environ, "DURABLE_REDIS_URL": redis_url, "DURABLE_PAYLOAD_HOOK": "nowhere"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1 and "expected module:attribute" in bad.stderr


def test_the_cli_finds_the_hook_module_in_the_current_folder(
    redis_url: str, no_hook: None, tmp_path: Path
) -> None:
    """The ``durable`` script (``-P``: as a console script, the current folder is not on
    ``sys.path``) imports $DURABLE_PAYLOAD_HOOK's module from where ``--app`` modules are
    found: ``examples.encryption:payload_hook`` run from a checkout failed with
    ModuleNotFoundError. A module that is nowhere says where it was looked for."""
    (tmp_path / "sealing.py").write_text(
        "class Hook:\n"
        "    def encode(self, data: bytes) -> bytes:\n        return data\n"
        "    def decode(self, data: bytes) -> bytes:\n        return data\n"
    )

    def durable(hook: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DURABLE_REDIS_URL": redis_url, "DURABLE_PAYLOAD_HOOK": hook}
        env.pop("PYTHONPATH", None)
        return subprocess.run(
            [sys.executable, "-P", "-m", "workers.cli", "list", "--limit", "1"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = durable("sealing:Hook")
    assert done.returncode == 0, done.stderr
    missing = durable("not_here:Hook")
    assert missing.returncode == 1 and "No module named 'not_here'" in missing.stderr
    assert "add its folder to PYTHONPATH" in missing.stderr, missing.stderr
    (tmp_path / "needs.py").write_text("import not_installed_anywhere\n")
    broken = durable("needs:Hook")  # found; what it imports is missing: no hint about its folder
    assert "No module named 'not_installed_anywhere'" in broken.stderr
    assert "PYTHONPATH" not in broken.stderr, broken.stderr


def test_hook_from_the_environment_and_reading_without_a_hook(
    no_hook: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_PAYLOAD_HOOK", "")
    assert codec.install_payload_hook_from_env() is None
    for value, message in [
        ("nowhere", "expected module:attribute"),
        ("no_such_module_x:hook", "ModuleNotFoundError"),
        ("durable.codec:MAX_DEPTH", "is a int, not a payload hook"),
        # A factory that raises (a key missing from the environment): a traceback from every command.
        (
            f"{__name__}:_ring_without_its_key",
            r"calling it raised KeyError: 'PAYLOAD_KEY' \(at .*test_codec_keyring.py:\d+ in _ring_without_its_key\)",
        ),
        ("os:system", r"calling it raised TypeError: .*system\(\) missing required argument"),
        # One that exits (sys.exit(3) when its key is missing) ended every command silently.
        (f"{__name__}:_ring_that_exits", r"calling it raised SystemExit: 3 \(at .*in _ring_that_exits\)"),
    ]:
        monkeypatch.setenv("DURABLE_PAYLOAD_HOOK", value)
        with pytest.raises(ConfigurationError, match=message):
            codec.install_payload_hook_from_env()
    monkeypatch.setenv("DURABLE_PAYLOAD_HOOK", f"{__name__}:_xor_ring")
    ring = codec.install_payload_hook_from_env()
    assert isinstance(ring, codec.KeyRing) and codec.get_payload_hook() is ring
    data = codec.dumps("4111")
    sealed = sealed_text.seal_text("card 4111 declined")
    assert isinstance(sealed, bytes) and b"4111" not in sealed
    assert sealed_text.open_text(b"dropped: " + sealed) == "dropped: card 4111 declined"
    codec.set_payload_hook(None)
    with pytest.raises(
        SerializationError, match=r"encrypted by a KeyRing \(key id 'x'\) and this process has no"
    ):
        codec.loads(data)
    assert sealed_text.open_text(sealed).startswith("<sealed text: payload is encrypted by a KeyRing")
    assert sealed_text.seal_text("plain") == "plain"  # no hook: stored as before


def _ring_that_exits() -> codec.KeyRing:
    sys.exit(3)


def _ring_without_its_key() -> codec.KeyRing:
    return codec.KeyRing({"k": Xor(int(os.environ["PAYLOAD_KEY"]))}, current="k")


def _xor_ring() -> codec.KeyRing:
    return codec.KeyRing({"x": Xor(5)}, current="x")


class RefusesBoom:
    """A hook whose encode fails for some payloads (a KMS refusing, an HSM down)."""

    def encode(self, data: bytes) -> bytes:
        if b"BOOM" in data:
            raise KeyError("cannot seal BOOM")
        return data

    def decode(self, data: bytes) -> bytes:
        return data


def test_a_hook_that_cannot_encode_blocks_the_run_not_the_worker(worker: Any, no_hook: None) -> None:
    """The decision's result failed to encode, then parking the run sealed the error's text with
    the same hook, which raised again: every worker that picked the run up stopped, each restart."""
    codec.set_payload_hook(RefusesBoom())
    stub = WorkflowStub.make(Joins).start("BO", "OM")  # the client writes "BO" and "OM": fine
    with pytest.raises(WorkflowBlocked, match=r"the payload hook could not encode \d+ bytes: KeyError"):
        stub.result(timeout=30)
    assert WorkflowStub.make(Joins).start("o", "k").result(timeout=30) == "ok"  # the worker goes on
    # A client whose payload the hook refuses gets one error, nothing written.
    with pytest.raises(SerializationError, match=r"the payload hook could not encode \d+ bytes: KeyError"):
        WorkflowStub.make(Joins).start("BOOM", "")
    stub.terminate()
    assert "<not stored: the payload hook could not seal this text" in sealed_text.seal_text("BOOM")
