-- Delete a task stream if it holds no task (its group and consumers go with it): the workflow
-- task stream of a retired build (no live worker serves the build, and it is not the queue's
-- current build), or the streams of a queue no live worker serves. Each deploy with a new build
-- id, and each queue name ever used (a queue per tenant), added streams per partition that
-- nothing removed. A stream that still holds tasks is kept: its runs wait for a worker (describe
-- says so). A task added later recreates the stream; the group is created from id 0 by the next
-- worker that serves it, so none is lost. (The queue's name stays known: see queues.py.)
-- KEYS: the stream
-- Returns 1 (deleted), 2 (there was none) or 0 (kept: it holds tasks)
if redis.call('EXISTS', KEYS[1]) == 0 then return 2 end
if redis.call('XLEN', KEYS[1]) > 0 then return 0 end
redis.call('DEL', KEYS[1])
return 1
