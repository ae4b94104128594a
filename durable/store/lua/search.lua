-- Evaluate a search query on one partition (durable/store/search.py compiles it; see the
-- index layout at sx_prefix in _lib.lua). Each node of the plan becomes a zset of run ids
-- scored by their created ms: a keyword leaf is an index key as it is; ranges, `not`, `and`,
-- `or` are computed into temporary keys of this partition (same slot), deleted before return.
-- Cost: the sizes of the sets a node combines (ZINTERSTORE walks the smallest), so a query
-- is bounded by the partition's matching index entries, not by its history.
-- KEYS: runs index of the partition
-- ARGV: plan (msgpack tree of {'k', suffix} | {'n', suffix, min, max} | {'r', min, max}
--       | {'all'} | {'not', node} | {'and'|'or', node...}), mode ('list' | 'count'),
--       window min, window max (created ms, ZRANGEBYSCORE syntax), limit,
--       paging cursor (list only, optional): created ms, run id -- the runs of that very ms
--       whose id sorts below the run id come first, then the window (which then ends
--       before that ms)
-- Returns list: {run id, created, ...} newest first -- the `limit` newest of the partition,
--       plus, on the `or` fast path, any rows tied with the last one's ms (the client
--       orders equal ms by run id); count: the number of runs.
local runs = KEYS[1]
local prefix = string.match(runs, '^(.-{%d+})') .. ':sx:'
local plan = cmsgpack.unpack(ARGV[1])
local mode, low, high, limit = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local tie_ms, tie_rid = ARGV[6] or '', ARGV[7] or ''
local temps = 0

local function temp()
  temps = temps + 1
  return prefix .. 'tmp:' .. temps
end

-- Whether score `s` is inside the ZRANGEBYSCORE-style bounds `min`, `max`.
local function inside(s, min, max)
  local function above(bound)
    if bound == '-inf' then return true end
    if string.sub(bound, 1, 1) == '(' then return s > tonumber(string.sub(bound, 2)) end
    return s >= tonumber(bound)
  end
  local function below(bound)
    if bound == '+inf' then return true end
    if string.sub(bound, 1, 1) == '(' then return s < tonumber(string.sub(bound, 2)) end
    return s <= tonumber(bound)
  end
  return above(min) and below(max)
end

-- At most this many candidates are checked one by one against a range (ZSCORE each) instead of
-- materialising the range: `customer = 'x' and amount > 5` costs the customer's runs, not the
-- runs with an amount.
local FILTER_MAX = 2000

local eval

-- `and` of keyword sets and ranges: intersect the sets, then filter by the ranges.
local function filtered(node)
  local sets, ranges = {'and'}, {}
  for i = 2, #node do
    local c = node[i]
    if c[1] == 'n' or c[1] == 'r' then ranges[#ranges + 1] = c else sets[#sets + 1] = c end
  end
  if #sets == 1 or #ranges == 0 then return nil end
  local base = eval(#sets == 2 and sets[2] or sets)
  if redis.call('ZCARD', base) > FILTER_MAX then return nil end
  local out = temp()
  redis.call('ZUNIONSTORE', out, 1, base)
  for _, m in ipairs(redis.call('ZRANGE', out, 0, -1)) do
    for _, r in ipairs(ranges) do
      local key, min, max = runs, r[2], r[3]
      if r[1] == 'n' then key, min, max = prefix .. r[2], r[3], r[4] end
      local s = tonumber(redis.call('ZSCORE', key, m))
      if not s or not inside(s, min, max) then
        redis.call('ZREM', out, m)
        break
      end
    end
  end
  return out
end

eval = function(node)
  local op = node[1]
  if op == 'k' then return prefix .. node[2] end
  if op == 'all' then return runs end
  if op == 'and' then
    local done = filtered(node)
    if done then return done end
  end
  local out = temp()
  if op == 'r' then
    redis.call('ZRANGESTORE', out, runs, node[2], node[3], 'BYSCORE')
  elseif op == 'n' then
    redis.call('ZRANGESTORE', out, prefix .. node[2], node[3], node[4], 'BYSCORE')
    redis.call('ZINTERSTORE', out, 2, out, runs, 'WEIGHTS', 0, 1)
  elseif op == 'not' then
    redis.call('ZDIFFSTORE', out, 2, runs, eval(node[2]))
  else
    local args = {op == 'and' and 'ZINTERSTORE' or 'ZUNIONSTORE', out, #node - 1}
    for i = 2, #node do args[#args + 1] = eval(node[i]) end
    args[#args + 1] = 'AGGREGATE'
    args[#args + 1] = 'MAX'  -- every set is scored by created ms: keep it (SUM would add them)
    redis.call(unpack(args))
  end
  return out
end

-- The newest rows of zset `key` (scored by created ms) after the paging cursor, at most
-- `limit`, as {member, score, ...}. The cursor's own ms comes first: its members below the
-- cursor's run id by byte order (ZREVRANGEBYLEX on a copy of that ms's members, all of one
-- score), not by a Lua string comparison, which follows the server's locale.
local function page(key)
  local out = {}
  if tie_rid ~= '' then
    local ties = temp()
    redis.call('ZRANGESTORE', ties, key, tie_ms, tie_ms, 'BYSCORE')
    for _, m in ipairs(redis.call('ZREVRANGEBYLEX', ties, '(' .. tie_rid, '-', 'LIMIT', 0, limit)) do
      out[#out + 1] = m
      out[#out + 1] = tie_ms
    end
  end
  local want = limit - #out / 2
  if want > 0 then
    local older = redis.call('ZREVRANGEBYSCORE', key, high, low, 'WITHSCORES', 'LIMIT', 0, want)
    for i = 1, #older do out[#out + 1] = older[i] end
  end
  return out
end

-- A list over `or` of keyword sets (`in (...)`, status = 'open'/'closed'): merge each set's
-- newest rows instead of building the union (O(sets x limit), not the sets' sizes). Sorted
-- by ms only (numbers: no locale), so every row tied with the `limit`-th one's ms is kept
-- too: the client orders those by run id and cuts.
local function merged()
  local rows, seen = {}, {}
  for i = 2, #plan do
    local got = page(prefix .. plan[i][2])
    for j = 1, #got, 2 do
      if not seen[got[j]] then
        seen[got[j]] = true
        rows[#rows + 1] = {got[j], tonumber(got[j + 1])}
      end
    end
  end
  table.sort(rows, function(a, b) return a[2] > b[2] end)
  local n = math.min(limit, #rows)
  while n > 0 and n < #rows and rows[n + 1][2] == rows[n][2] do n = n + 1 end
  local out = {}
  for i = 1, n do
    out[#out + 1] = rows[i][1]
    out[#out + 1] = tostring(rows[i][2])
  end
  return out
end

local only_keywords = mode == 'list' and plan[1] == 'or'
if only_keywords then
  for i = 2, #plan do
    if plan[i][1] ~= 'k' then only_keywords = false end
  end
end

local reply
if only_keywords then
  reply = merged()
elseif mode == 'count' then
  reply = redis.call('ZCOUNT', eval(plan), low, high)
else
  reply = page(eval(plan))
end
for i = 1, temps do redis.call('DEL', prefix .. 'tmp:' .. i) end
return reply
