"""The Lua scripts build keys and members from the same fragments as ``durable.store.keys``."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from durable.store import keys as K
from durable.store.keys import Keys
from durable.store.redis_store import RedisStore

LUA = {
    entry.name: entry.read_text()
    for entry in (resources.files("durable.store") / "lua").iterdir()
    if entry.name.endswith(".lua")
}

# Literals concatenated in the scripts that are not key or member fragments.
NOT_KEYS = {
    "0-",  # a history entry id: 0-<seq>
    "\\131",  # the msgpack header of an event envelope (a map of 3)
    "(",  # an exclusive XRANGE bound: (<ms>-0
    "-0",
    "\\130",  # the msgpack header of HookResumed's data (a map of 2)
    " ",  # the run record's list of hook tokens: " <hook id>=<digest>" words
    "=",
    "dropped by durable repair: ",  # a dead letter's reason
}


def _code(source: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in source.splitlines())


def _concatenated() -> set[str]:
    """Every string literal the scripts concatenate (``'x' ..`` or ``.. 'x'``)."""
    found: set[str] = set()
    for source in LUA.values():
        code = _code(source)
        found |= set(re.findall(r"'([^']*)'\s*\.\.", code))
        found |= set(re.findall(r"\.\.\s*'([^']*)'", code))
    return found


def _fragments() -> dict[str, str]:
    """The fragments keys.py builds keys and members from, by what they are."""
    k, x = Keys("durable", 8), "X"
    tag = k.tag(0)

    def infix(key: str) -> str:
        assert key.startswith(tag)
        return key[len(tag) :].split(x)[0]

    return {
        "run key": infix(k.run(0, x)),
        "inbox key": infix(k.inbox(0, x)),
        "activities key": infix(k.activities(0, x)),
        "lease key": infix(k.alive(0, x)),
        "workflow tasks key": infix(k.workflow_tasks(0, x)),
        "sessions key": infix(k.sessions(0)),
        "clock key": infix(k.clock(0)),
        "instance key": infix(k.instance(0, x)),
        "history key": infix(k.history(0, x)),
        "log key": infix(k.log(0, x)),
        "updates key": infix(k.updates(0, x)),
        "closed runs key": k.closed(0)[len(tag) :],
        "timers key": k.timers(0)[len(tag) :],
        "closes stream key": k.closes(0)[len(tag) :],
        "retention key": k.retention(0)[len(tag) :],
        "hooks key": k.hooks(0)[len(tag) :],
        "attempt field": K.attempt_field(x)[len(x) :],
        "stream field": K.stream_field(x)[len(x) :],
        "heartbeat field": K.heartbeat_field(x)[len(x) :],
        "started field": K.started_field(x)[len(x) :],
        "worker field": K.worker_field(x)[len(x) :],
        "rerun field": K.rerun_field(x)[len(x) :],
        "handed field": K.handed_field(x)[len(x) :],
        "member separator": K.attempt_member(x, x, 2).split(x)[1],
        "leased attempt member tail": K.attempt_member(x, x, 1)[len(x + "|" + x) :],
        "retry member head": K.retry_member(x, x).split(x)[0],
        "search index infix": k.search(0, x)[len(tag) :].split(x)[0],
        "search keyword head": K.keyword_posting(x, x).split(x)[0],
        "search keyword separator": K.keyword_posting(x, x).split(x)[1],
        "status index head": K.keyword_posting("status", x).split(x)[0],
        "closed time index": K.number_posting("closed"),
        "search temp head": K.search_temp(x).split(x)[0],
    }


def test_every_concatenated_literal_comes_from_keys_py() -> None:
    expected = set(_fragments().values())
    strays = _concatenated() - expected - NOT_KEYS
    assert not strays, f"the Lua scripts build keys/members from fragments keys.py does not know: {strays}"


def test_keys_py_fragments_are_the_ones_the_scripts_use() -> None:
    used = _concatenated()
    unused = {what: frag for what, frag in _fragments().items() if frag not in used}
    assert not unused, f"keys.py and the Lua scripts disagree on: {unused}"


def test_timer_kinds_match() -> None:
    kinds = set()
    for source in LUA.values():
        kinds |= set(re.findall(r"kind == '(\w+)'", _code(source)))
    assert kinds == {K.TIMER, K.RETRY, K.DEADLINE, K.HANDED_BACK, K.HANDED_BACK_ACTIVITY}


def test_private_queue_marker() -> None:
    k = Keys("durable", 8)
    assert k.activity_tasks(0, "@w")[len(k.tag(0)) :].startswith(":aq:" + K.PRIVATE)
    assert K.is_private("@w") and not K.is_private("default")


def _patterns() -> set[str]:
    found: set[str] = set()
    for source in LUA.values():
        found |= set(re.findall(r"string\.match\([^,]+,\s*'([^']+)'\)", _code(source)))
    return found


def test_lua_patterns_parse_what_keys_py_builds(store: RedisStore) -> None:
    """Run each pattern the scripts match with on Redis against keys and members keys.py builds."""
    k = store.keys
    cases = {
        "^(.-{%d+})": [(k.run(3, "r1"), [k.tag(3)]), (k.instance(5, "a:b{c}"), [k.tag(5)])],
        ":aq:(@.+)$": [(k.activity_tasks(3, "@w-1"), ["@w-1"]), (k.activity_tasks(3, "default"), [])],
        "^(%a)|([^|]+)|(.+)$": [
            (K.timer_member("r1", "t2"), [K.TIMER, "r1", "t2"]),
            (K.retry_member("r1", "a|2"), [K.RETRY, "r1", "a|2"]),
            (K.deadline_member("r1", "execution"), [K.DEADLINE, "r1", "execution"]),
            (K.handed_back_member("r1", 5), [K.HANDED_BACK, "r1", "5"]),
            (K.handed_back_member("r1", 0, "a.1"), [K.HANDED_BACK_ACTIVITY, "r1", "a.1|0"]),
        ],
        "^(.+)|(%d+)$": [(K.handed_back_member("r1", 7, "a.1").split("|", 2)[2], ["a.1", "7"])],
        "^([^|]+)|": [(K.hook_target("r1", "h|2"), ["r1"])],
        # begin_attempt.lua: the begins of the attempt last begun; an older release wrote no count.
        "^(%d+)|[^|]*|(%d+)$": [(K.begun_by(2, "w-1", 3), ["2", "3"]), ("2|w-1", [])],
        "^(%d+)|": [(K.begun_by(2, "w-1", 3), ["2"]), ("2|w-1", ["2"])],
        # ... and the worker that began it (named in the `lost` attempt record).
        "^%d+|([^|]*)": [(K.begun_by(2, "vm:1:2.1", 3), ["vm:1:2.1"]), ("2|w-1", ["w-1"])],
        "^([^|]+)|(.+)$": [(K.hook_target("r1", "h.2"), ["r1", "h.2"])],
        # _lib.lua terminate_run: the seq of a history stream's top entry (ids are 0-<seq>).
        "^0%-(%d+)$": [("0-7", ["7"]), ("0-12345", ["12345"]), ("1796-0", [])],
        # requeue_pending.lua: the partition's tag of an activity stream (its runs' keys share it) ...
        "^(.*):aq:": [(k.activity_tasks(3, "default"), [k.tag(3)]), (k.workflow_tasks(3, "default"), [])],
        # ... and begin_attempt.lua: who handed the attempt back, and why (a why may hold a "|").
        "^([^|]*)|(.*)$": [
            (K.handed_by("vm:1:2.1", "stopping | past --grace"), ["vm:1:2.1", "stopping | past --grace"])
        ],
    }
    assert _patterns() == set(cases), "a script matches with a pattern this test does not check"
    for pattern, examples in cases.items():
        for subject, want in examples:
            got = store.redis.eval("return {string.match(ARGV[1], ARGV[2])}", 0, subject, pattern)
            assert [g.decode() for g in got] == want, (pattern, subject)


@pytest.mark.parametrize("run_id, item", [("r1", "t1"), ("run-ab", "a|b")])
def test_members_round_trip(run_id: str, item: str) -> None:
    assert K.parse_timer_member(K.timer_member(run_id, item)) == (K.TIMER, run_id, item)
    assert K.parse_timer_member(K.retry_member(run_id, item)) == (K.RETRY, run_id, item)
    assert K.parse_timer_member(K.deadline_member(run_id, "run")) == (K.DEADLINE, run_id, "run")
    assert K.parse_hook_target(K.hook_target(run_id, item)) == (run_id, item)
    assert K.parse_attempt_member(K.attempt_member(run_id, "a", 3)) == (run_id, "a", 3)
