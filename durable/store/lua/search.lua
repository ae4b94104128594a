-- Evaluate a search query on one partition (durable/store/search.py compiles it; see the
-- index layout at sx_prefix in _lib.lua). Each node of the plan becomes a zset of run ids
-- scored by their created ms: a keyword leaf is an index key as it is; ranges, `not`, `and`,
-- `or` are computed into temporary keys of this partition (same slot), deleted before return.
-- Cost: the sizes of the sets a node combines (ZINTERSTORE walks the smallest), so a query
-- is bounded by the partition's matching index entries, not by its history.
-- KEYS: runs index of the partition
-- ARGV: plan (msgpack tree of {'k', suffix} | {'n', suffix, min, max} | {'r', min, max}
--       | {'all'} | {'not', node} | {'and'|'or', node...}), mode ('list' | 'count'),
--       window min, window max (created ms, ZRANGEBYSCORE syntax), limit
-- Returns list: {run id, created, ...} newest first; count: the number of runs.
local runs = KEYS[1]
local prefix = string.match(runs, '^(.-{%d+})') .. ':sx:'
local plan = cmsgpack.unpack(ARGV[1])
local mode, low, high, limit = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local temps = 0

local function temp()
  temps = temps + 1
  return prefix .. 'tmp:' .. temps
end

local function eval(node)
  local op = node[1]
  if op == 'k' then return prefix .. node[2] end
  if op == 'all' then return runs end
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

local result = eval(plan)
local reply
if mode == 'count' then
  reply = redis.call('ZCOUNT', result, low, high)
else
  reply = redis.call('ZREVRANGEBYSCORE', result, high, low, 'WITHSCORES', 'LIMIT', 0, limit)
end
for i = 1, temps do redis.call('DEL', prefix .. 'tmp:' .. i) end
return reply
