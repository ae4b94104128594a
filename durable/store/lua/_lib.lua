-- Shared helpers, prepended to every script when it is loaded (store/base.py).
-- Every key a script touches shares one partition hash tag, so a script runs
-- unchanged on one Redis or on a Redis Cluster. Keys built here from a tag
-- (run keys named inside task or timer members) stay in that same slot.

redis.replicate_commands()

local GROUP = 'workers'

-- LOG_MAXLEN (entries a run's log keeps, about) is not defined here: store/base.py prepends
-- it from its one Python definition (durable.store.base.LOG_MAXLEN) when it loads the scripts.

-- Append one entry (attempt or dropped input) to a run's log, the record kept beside its
-- history. Capped: a run retrying an activity for hours would otherwise grow it without
-- bound (thousands of entries a minute); `~` trims whole stream nodes, so it stays cheap
-- and the log holds the last LOG_MAXLEN entries, a stream node or so more.
local function log_add(log, ...)
  redis.call('XADD', log, 'MAXLEN', '~', LOG_MAXLEN, '*', ...)
end

-- The clock of a partition: Redis TIME plus an offset kept in `<tag>:clock`
-- (absent = 0). Only durable.testing sets it (time skipping). The tag is the
-- partition prefix of KEYS[1], which every script passes, so the key is in
-- the script's own slot.
local clock_offset = nil

local function now_ms()
  if clock_offset == nil then
    clock_offset = 0
    local tag = KEYS[1] and string.match(KEYS[1], '^(.-{%d+})')
    if tag then clock_offset = tonumber(redis.call('GET', tag .. ':clock')) or 0 end
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + clock_offset
end

-- The stored bytes of an event: msgpack map {type, ts, data}; `data` is
-- already msgpack. The script that adds an input stamps its ts here, once;
-- the commit copies the bytes unchanged into the history.
local function envelope(type_name, ts, data)
  return '\131' .. cmsgpack.pack('type') .. cmsgpack.pack(type_name)
    .. cmsgpack.pack('ts') .. cmsgpack.pack(ts)
    .. cmsgpack.pack('data') .. data
end

local OPEN = {pending = true, running = true, suspended = true, cancelling = true}

local function is_open(status)
  return status ~= false and status ~= nil and OPEN[status] == true
end

-- The stream the run's next workflow task goes to: the private stream of the
-- worker that decided it last (`sticky`, where its driver is still cached) while
-- that worker's lease is alive, else the run's queue (`wq`, any worker).
local function task_stream(run_key)
  local fields = redis.call('HMGET', run_key, 'wq', 'sticky')
  local host = fields[2]
  if host and host ~= '' then
    local tag = string.match(run_key, '^(.-{%d+})')
    if redis.call('EXISTS', tag .. ':alive:' .. host) == 1 then return tag .. ':wq:' .. host end
  end
  return fields[1]
end

-- Hand one of a private stream's workflow tasks (run `rid`) back to the run's queue, where
-- any worker takes it: its owner `host` is gone or too slow. The run stops being sticky
-- to that host, so its later tasks go to the queue too (the next decider makes it its own).
-- Returns 1 when the task moved, 0 when the run is gone.
local function hand_back(tag, host, rid)
  local run = tag .. ':run:' .. rid
  local wq = redis.call('HGET', run, 'wq')
  if not wq then return 0 end
  if redis.call('HGET', run, 'sticky') == host then redis.call('HDEL', run, 'sticky') end
  redis.call('XADD', wq, '*', 'run', rid)
  return 1
end

-- The run id a workflow task entry names ('' when none).
local function entry_run(entry)
  local f = entry[2]
  for i = 1, #f, 2 do if f[i] == 'run' then return f[i + 1] end end
  return ''
end

-- Enqueue a workflow task for the run unless one is already pending: a run
-- has at most one pending workflow task, however many inputs arrive.
local function wake(run_key, run_id)
  if redis.call('HGET', run_key, 'task') == '1' then return 0 end
  redis.call('HSET', run_key, 'task', '1')
  redis.call('XADD', task_stream(run_key), '*', 'run', run_id)
  return 1
end

-- A client's input (a signal, a hook payload): the run an earlier send of this same input went to
-- (its reply was lost in an outage and the client sent it again), or false. `key` is its T:sent
-- key ('' or nil: none).
local function sent_before(key)
  if not key or key == '' then return false end
  return redis.call('GET', key)
end

-- Note that a client's input went to run `rid`, for `ttl` ms (past the client's last retry).
local function note_sent(key, rid, ttl)
  if key and key ~= '' then redis.call('SET', key, rid, 'PX', ttl) end
end

-- The first key of `expected` ({key, kind, key, kind, ...}) that holds another kind of value
-- (made by hand, or by another program sharing the database), as {key, the kind it holds, the
-- kind expected}; nil: none (a missing key is fine). Checked before a script writes anything: a
-- command failing with WRONGTYPE half-way does not undo the writes before it.
local function wrong_kind(expected)
  for i = 1, #expected, 2 do
    local kind = redis.call('TYPE', expected[i]).ok
    if kind ~= 'none' and kind ~= expected[i + 1] then return {expected[i], kind, expected[i + 1]} end
  end
  return nil
end

-- A client's input (signal, update) to an open run, within the run's limits
-- ({most inbox items, most history events, most bytes of client inputs}; 0 or missing: none):
-- pushed onto its inbox (the run woken), or refused with {'LIMIT', limit, count}. The bytes are
-- every client input the run took, decided or not: all go into its history, so past
-- max_history_bytes the run could only be terminated for it; refusing the input the client
-- sends keeps the run, and keeps an undecided pile from growing past what one commit can write.
local function take_input(run, inbox, rid, limits, type_name, data)
  limits = limits or {}
  local max_inbox, max_events = tonumber(limits[1]) or 0, tonumber(limits[2]) or 0
  local max_bytes = tonumber(limits[3]) or 0
  if max_inbox > 0 or max_events > 0 or max_bytes > 0 then
    local pending = redis.call('LLEN', inbox)
    if max_inbox > 0 and pending >= max_inbox then return {'LIMIT', 'max_pending_signals', pending} end
    local events = (tonumber(redis.call('HGET', run, 'seq')) or 0) + pending
    if max_events > 0 and events >= max_events then return {'LIMIT', 'max_history_events', events} end
    if max_bytes > 0 then
      local taken = tonumber(redis.call('HGET', run, 'inbytes')) or 0
      if taken + #data > max_bytes then return {'LIMIT', 'max_history_bytes', taken + #data} end
      redis.call('HINCRBY', run, 'inbytes', #data)
    end
  end
  redis.call('RPUSH', inbox, envelope(type_name, now_ms(), data))
  wake(run, rid)
  return nil
end

-- Forget an activity that is no longer pending: all of its fields in the run's activities hash
-- (body, current attempt, task stream, heartbeat details, start, who began it, the attempt whose
-- lapsed lease put it in its queue again).
local function forget_activity(acts, aid)
  redis.call('HDEL', acts, aid, aid .. '#', aid .. '@', aid .. ':hb', aid .. ':started', aid .. ':worker',
    aid .. ':rerun')
end

-- Add an activity task (field/value pairs) to its stream; returns its entry id. A task in a worker
-- session's private stream (T:aq:@host) makes that host a session host, so its stream is not
-- forgotten and a dead host's tasks get failed (unstick.lua).
local function add_task(stream, sessions, ...)
  local id = redis.call('XADD', stream, '*', ...)
  local private = string.match(stream, ':aq:(@.+)$')
  if private then redis.call('SADD', sessions, private) end
  return id
end

-- Put attempt `attempt` of activity `aid` (run `rid`) in its queue's stream again, as the same
-- attempt. Returns 1, or 0 when there is nothing to run: the attempt is no longer the current
-- one, or the run is closed.
local function requeue_attempt(run, acts, sessions, rid, aid, attempt)
  local current = redis.call('HMGET', acts, aid, aid .. '#', aid .. '@')
  if not current[1] or tonumber(current[2]) ~= attempt or not current[3] then return 0 end
  if not is_open(redis.call('HGET', run, 'status')) then return 0 end
  add_task(current[3], sessions, 'run', rid, 'act', aid, 'body', current[1])
  return 1
end

local function ack(stream, entry_id)
  if entry_id ~= nil and entry_id ~= '' then
    redis.call('XACK', stream, GROUP, entry_id)
    redis.call('XDEL', stream, entry_id)
  end
end

-- Search index (durable/store/search.py), per partition: `<tag>:sx:k:<attr>:<value>` zsets
-- (run created ms -> run id) for keyword-like values (keywords, bools, list items, text words,
-- type, queue, status, build id, schedule id), `<tag>:sx:n:<attr>` zsets (number or ms -> run
-- id) for numbers and times (`closed` too); start time is the runs index itself. The run record
-- remembers what it indexed beyond its own fields: `sx` (JSON postings of its search attributes,
-- each [suffix] or [suffix, score]) and `sxs` (the status indexed), so any change or a purge
-- removes exactly those entries.
local function sx_prefix(run_key)
  return string.match(run_key, '^(.-{%d+})') .. ':sx:'
end

local function sx_created(run_key)
  return tonumber(redis.call('HGET', run_key, 'created')) or 0
end

-- Index a built-in keyword value (type, queue, build id, schedule id); '' is not indexed.
local function sx_keyword(run_key, rid, attr, value)
  if value and value ~= '' then
    redis.call('ZADD', sx_prefix(run_key) .. 'k:' .. attr .. ':' .. value, sx_created(run_key), rid)
  end
end

-- Move the run to the status set of its current `status` field (idempotent).
local function sx_status(run_key, rid)
  local f = redis.call('HMGET', run_key, 'status', 'sxs', 'created')
  if not f[1] or f[1] == f[2] then return end
  local at = sx_prefix(run_key) .. 'k:status:'
  if f[2] then redis.call('ZREM', at .. f[2], rid) end
  redis.call('ZADD', at .. f[1], tonumber(f[3]) or 0, rid)
  redis.call('HSET', run_key, 'sxs', f[1])
end

-- Replace the run's search attributes: `values` (JSON, shown by describe) and `postings` (JSON).
local function sx_set(run_key, rid, values, postings)
  local prefix = sx_prefix(run_key)
  local old = redis.call('HGET', run_key, 'sx')
  if old then
    for _, p in ipairs(cjson.decode(old)) do redis.call('ZREM', prefix .. p[1], rid) end
  end
  local list = cjson.decode(postings)
  local created = sx_created(run_key)
  for _, p in ipairs(list) do
    if #p == 2 then redis.call('ZADD', prefix .. p[1], p[2], rid) else redis.call('ZADD', prefix .. p[1], created, rid) end
  end
  if #list > 0 then redis.call('HSET', run_key, 'sx', postings) else redis.call('HDEL', run_key, 'sx') end
  if values ~= '' and values ~= '{}' then redis.call('HSET', run_key, 'sa', values) else redis.call('HDEL', run_key, 'sa') end
end

-- A run closed: its close time and final status.
local function sx_closed(run_key, rid)
  local closed = tonumber(redis.call('HGET', run_key, 'closed'))
  if closed then redis.call('ZADD', sx_prefix(run_key) .. 'n:closed', closed, rid) end
  sx_status(run_key, rid)
end

-- Remove every index entry of a run (purge).
local function sx_drop(run_key, rid)
  local prefix = sx_prefix(run_key)
  local f = redis.call('HMGET', run_key, 'sx', 'sxs', 'type', 'queue', 'build', 'schedule_id')
  if f[1] then
    for _, p in ipairs(cjson.decode(f[1])) do redis.call('ZREM', prefix .. p[1], rid) end
  end
  local attrs = {'status', 'type', 'queue', 'build_id', 'schedule_id'}
  for i = 2, 6 do
    if f[i] and f[i] ~= '' then redis.call('ZREM', prefix .. 'k:' .. attrs[i - 1] .. ':' .. f[i], rid) end
  end
  redis.call('ZREM', prefix .. 'n:closed', rid)
end

-- Index a new run: built-ins from its record, then its initial search attributes and memo
-- (`sx`: a map {sa = values JSON, sx = postings JSON, memo = payload, sched = schedule id}).
local function sx_start(run_key, rid, sx)
  local f = redis.call('HMGET', run_key, 'type', 'queue', 'build')
  sx_keyword(run_key, rid, 'type', f[1])
  sx_keyword(run_key, rid, 'queue', f[2])
  sx_keyword(run_key, rid, 'build_id', f[3])
  sx_status(run_key, rid)
  if sx == nil then return end
  if sx.sched and sx.sched ~= '' then
    redis.call('HSET', run_key, 'schedule_id', sx.sched)
    sx_keyword(run_key, rid, 'schedule_id', sx.sched)
  end
  if sx.sx then sx_set(run_key, rid, sx.sa, sx.sx) end
  if sx.memo and sx.memo ~= '' then redis.call('HSET', run_key, 'memo', sx.memo) end
end

-- Retention: a run that closes is indexed in `<tag>:closed` by when its retention ends
-- (its own `retention` field, set at start from its type, else the namespace's
-- `<tag>:retention`, else 3 days), in server time without the test clock offset:
-- retention is operations, not workflow time. The scheduler purges it then.
local DEFAULT_RETENTION_MS = 259200000  -- durable.retention.DEFAULT_RETENTION

local function real_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function namespace_retention_ms(tag)
  return tonumber(redis.call('GET', tag .. ':retention')) or DEFAULT_RETENTION_MS
end

local function index_closed(run_key, rid)
  local tag = string.match(run_key, '^(.-{%d+})')
  local keep = tonumber(redis.call('HGET', run_key, 'retention')) or namespace_retention_ms(tag)
  redis.call('ZADD', tag .. ':closed', real_now_ms() + keep, rid)
  sx_closed(run_key, rid)
end

-- Hook tokens: the partition's `<tag>:hooks` maps a token's digest to "run|hook id"; the
-- run record's `hooks` field lists its live tokens as " <hook id>=<digest>" words, so a
-- token goes when its wait ends, when it is used, and when the run closes.
local function hooks_key(run_key)
  return string.match(run_key, '^(.-{%d+})') .. ':hooks'
end

local function hook_add(run_key, rid, hook_id, digest)
  redis.call('HSET', hooks_key(run_key), digest, rid .. '|' .. hook_id)
  local list = redis.call('HGET', run_key, 'hooks') or ''
  redis.call('HSET', run_key, 'hooks', list .. ' ' .. hook_id .. '=' .. digest)
end

local function hook_remove(run_key, hook_id)
  local list = redis.call('HGET', run_key, 'hooks')
  if not list then return end
  local needle = ' ' .. hook_id .. '='
  local at = string.find(list, needle, 1, true)
  if not at then return end
  local stop = string.find(list, ' ', at + 1, true) or (#list + 1)
  redis.call('HDEL', hooks_key(run_key), string.sub(list, at + #needle, stop - 1))
  local rest = string.sub(list, 1, at - 1) .. string.sub(list, stop)
  if rest == '' then redis.call('HDEL', run_key, 'hooks') else redis.call('HSET', run_key, 'hooks', rest) end
end

local function close_hooks(run_key)
  local list = redis.call('HGET', run_key, 'hooks')
  if not list then return end
  local hooks = hooks_key(run_key)
  for digest in string.gmatch(list, '=(%S+)') do redis.call('HDEL', hooks, digest) end
  redis.call('HDEL', run_key, 'hooks')
end

-- Close an open run as terminated: WorkflowTerminated after its last seq, inbox kept
-- beside the history as dropped, pending activities voided, hooks deleted, the parent
-- told (`to_parent`: an outbox message, or ''), its children closed by their parent close
-- policy (`to_children`: outbox messages; in the same script, so that no crash of the caller
-- leaves them running). Shared by terminate.lua and the terminate_existing conflict policy of
-- start_run.lua. Returns the new seq.
local function terminate_run(rid, instance, run, history, inbox, acts, log, outbox, data, to_parent, to_children,
                             timers)
  local ts = now_ms()
  -- Its timers, retries and timeouts: nothing fires them for a closed run (the caller names them).
  local timers_key = string.match(run, '^(.-{%d+})') .. ':timers'
  for _, member in ipairs(timers or {}) do redis.call('ZREM', timers_key, member) end
  local seq = tonumber(redis.call('HGET', run, 'seq')) + 1
  -- After entries a commit wrote before failing half-way (the record does not count them):
  -- the termination goes after them, the history kept as it is.
  local top = redis.call('XREVRANGE', history, '+', '-', 'COUNT', 1)[1]
  if top then seq = math.max(seq, tonumber(string.match(top[1], '^0%-(%d+)$') or '0') + 1) end
  redis.call('XADD', history, '0-' .. seq, 'e', envelope('WorkflowTerminated', ts, data))
  for _, item in ipairs(redis.call('LRANGE', inbox, 0, -1)) do
    log_add(log, 'kind', 'dropped', 'e', item, 'reason', 'run terminated', 'ts', ts)
  end
  redis.call('DEL', inbox, acts)
  redis.call('HSET', run, 'seq', seq, 'status', 'terminated', 'closed', ts, 'outcome', 'terminated', 'task', '0',
    'updated', ts)
  redis.call('HSET', instance, 'status', 'terminated', 'updated', ts)
  index_closed(run, rid)
  close_hooks(run)
  if to_parent ~= '' then redis.call('XADD', outbox, '*', 'm', to_parent) end
  for _, message in ipairs(to_children or {}) do redis.call('XADD', outbox, '*', 'm', message) end
  -- No decision counts this close: tell the metrics readers (only when one made the stream).
  local closes = string.match(run, '^(.-{%d+})') .. ':closes'
  if redis.call('EXISTS', closes) == 1 then
    redis.call('XADD', closes, 'MAXLEN', '~', 1000, '*', 't', redis.call('HGET', run, 'type') or '', 'o', 'terminated')
  end
  return seq
end
