-- A speculative claim (`worker.scheduling.queue.speculative`): claim_first, made in the same script as the
-- survey the device's policy has not yet seen, keeping what it changes besides the lease (undo_* fields) for
-- unclaim.lua to restore, should the policy choose another trial.
local function claim_speculatively(ids, device)
  return claim_first(ids, device, function(id)
    local t = redis.call('HMGET', tkey(id), 'team', 'device', 'message', 'active')
    redis.call('HSET', tkey(id), 'undo_device', t[2] or '', 'undo_message', t[3] or '', 'undo_active', t[4] or '',
               'undo_served', redis.call('HGET', key('served'), t[1] or '') or '')
  end)
end
