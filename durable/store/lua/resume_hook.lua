-- Resume a hook, atomically: find the run its token's digest names, use the token up
-- (single use) and push HookResumed onto the run's inbox. One script: a crash cannot
-- leave a used token without its payload, nor deliver a payload twice.
-- KEYS: hooks (the partition's token digests)
-- ARGV: token digest, HookResumed data without its id (msgpack map {payload}), the token
--       itself (tokens stored in plaintext by an older version are looked up by it)
--       [, this call's T:sent key, its time to live (ms)]
-- Returns {'OK', run id} | {'UNKNOWN'} | {'CLOSED', status, run id}
--   (the same call sent again after its reply was lost: {'OK', the run it went to})
local hooks, digest, data = KEYS[1], ARGV[1], ARGV[2]
local sent = sent_before(ARGV[4])
if sent then return {'OK', sent} end
local target = redis.call('HGET', hooks, digest)
if not target then
  digest = ARGV[3]
  target = redis.call('HGET', hooks, digest)
end
if not target then return {'UNKNOWN'} end
local rid, hook_id = string.match(target, '^([^|]+)|(.+)$')
local tag = string.match(hooks, '^(.-{%d+})')
local run, inbox = tag .. ':run:' .. rid, tag .. ':in:' .. rid
local status = redis.call('HGET', run, 'status')
if not is_open(status) then
  redis.call('HDEL', hooks, digest)
  return {'CLOSED', status or 'missing', rid}
end
hook_remove(run, hook_id)
redis.call('HDEL', hooks, digest)  -- a legacy token (not in the run's list)
-- data is a one-entry msgpack map; prepend the id to make it {id, payload}.
local event_data = '\130' .. cmsgpack.pack('id') .. cmsgpack.pack(hook_id) .. string.sub(data, 2)
redis.call('RPUSH', inbox, envelope('HookResumed', now_ms(), event_data))
note_sent(ARGV[4], rid, ARGV[5])
wake(run, rid)
return {'OK', rid}
