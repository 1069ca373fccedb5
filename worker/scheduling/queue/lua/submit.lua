-- args: id job export_dir team priority host_bytes paused width_cap lane_bytes
-- Add trial `id` in state planning; `paused` '1': once planned, it waits paused (a pause asked at once, as
-- control.lua would ask it). `width_cap`: the most devices its units may run on at once, each beyond the
-- first keeping `lane_bytes` more on the host (see admit). Returns 'ok', or 'exists'.
if redis.call('EXISTS', tkey(id)) == 1 then return 'exists' end
local now = now_ms() / 1000
redis.call('HSET', tkey(id), 'job', job, 'export_dir', export_dir, 'submitted', now, 'units_done', 0,
           'requeues', 0, 'team', team, 'priority', priority, 'host_bytes', host_bytes, 'width_cap', width_cap,
           'lane_bytes', lane_bytes)
if paused == '1' then redis.call('HSET', tkey(id), 'control', 'pause') end
redis.call('ZADD', key('trials'), now, id)
planning_add(id, false)
set_state(id, 'planning')
wake()
return 'ok'
