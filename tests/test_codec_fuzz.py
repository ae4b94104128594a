"""Fuzz the payload decoder with hypothesis, in a subprocess so a crash fails the test.

Random bytes and random msgpack trees full of extension values (deep chains included)
must decode to a value or raise SerializationError, and a value that decodes must encode
again (the encoder and the decoder enforce the same limits).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FUZZ = textwrap.dedent(
    """
    import sys
    import msgpack
    from hypothesis import HealthCheck, given, settings, strategies as st

    from durable import codec
    from durable.errors import SerializationError

    import apps.payments  # a module with registered workflows: its types are allowed

    assert codec.__file__.startswith(sys.argv[2]), codec.__file__  # this worktree's codec

    NAMES = [
        "apps.payments.PaymentDeclined", "apps.payment_errors.GatewayDown", "builtins.ValueError",
        "builtins.KeyboardInterrupt", "subprocess.Popen", "os.system", "http.HTTPStatus",
        "durable.errors.ApplicationError", "no.such.Thing", "apps.payments.Checkout", "",
    ]
    CONTAINERS = [2, 3, 4, 11, 12, 13]

    def ext(code, body):
        return msgpack.packb(msgpack.ExtType(code, body))

    def array(items):
        return msgpack.packb(len(items) * [None])[: -len(items) or None] + b"".join(items)

    def named(name, child):
        return msgpack.packb([name, 0])[:-1] + child

    def exception(name, child):
        body = {"type": name, "message": "m", "args": [child], "traceback": "", "cause": None, "attrs": {"a": child}}
        return msgpack.packb(body)

    scalars = st.one_of(
        st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=8), st.binary(max_size=8), st.none(),
        st.booleans(),
    ).map(msgpack.packb)

    def grow(children):
        return st.one_of(
            st.lists(children, max_size=4).map(array),
            st.lists(st.tuples(children, children), max_size=3).map(
                lambda kv: bytes([0x80 | len(kv)]) + b"".join(k + v for k, v in kv)
            ),
            st.tuples(st.integers(0, 20), children).map(lambda t: ext(t[0], array([t[1]]))),
            st.tuples(st.integers(0, 20), st.binary(max_size=12)).map(lambda t: ext(*t)),
            st.tuples(st.sampled_from(NAMES), children).map(lambda t: ext(11, named(t[0], t[1]))),
            st.tuples(st.sampled_from(NAMES), children).map(lambda t: ext(13, named(t[0], t[1]))),
            st.tuples(st.sampled_from(NAMES), children).map(lambda t: ext(12, exception(*t))),
        )

    trees = st.recursive(scalars, grow, max_leaves=25)

    @st.composite
    def chains(draw):
        data = draw(trees)
        for _ in range(draw(st.integers(1, 300))):
            lists = draw(st.integers(0, 40))
            data = ext(draw(st.sampled_from(CONTAINERS[:3])), b"\\x91" * (lists + 1) + data)
        return data

    def check(data):
        try:
            value = codec.loads(data)
        except SerializationError:
            return
        codec.dumps(value)  # what decodes must encode again

    FAST = settings(max_examples=int(sys.argv[1]), deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))

    @FAST
    @given(st.binary(max_size=64))
    def random_bytes(data):
        check(data)

    @FAST
    @given(st.one_of(trees, chains()))
    def random_trees(data):
        check(data)

    random_bytes()
    random_trees()
    print("fuzz ok")
    """
)


def test_decoder_fuzz_never_crashes() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", FUZZ, "800", str(ROOT)],
        cwd=ROOT / "tests",
        env={**__import__("os").environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    # A crash shows as a negative return code (-11: SIGSEGV) with no Python traceback.
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "fuzz ok" in proc.stdout
