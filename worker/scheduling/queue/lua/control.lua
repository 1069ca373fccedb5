-- args: action id
-- Pause, resume or cancel trial `id` (`action`): returns its state afterwards, 'missing', or 'invalid:<state>'.
-- A trial whose unit (or planning) is in flight is asked through `control`, which the end of that unit honours
-- (after_unit); any other changes at once.
local function ask(control)
  return function()
    redis.call('HSET', tkey(id), 'control', control)
    widen_update(id)  -- no other device takes a unit of it meanwhile
  end
end
local function drop_pause()
  if redis.call('HGET', tkey(id), 'control') == 'pause' then redis.call('HDEL', tkey(id), 'control') end
end
local function cancel_now()
  runnable_remove(id)
  set_state(id, 'cancelled')
end
-- Per action, per state the trial may be in: what the action does, or true when it is done already. A state
-- not listed cannot take the action.
local ACTIONS = {
  pause = {
    runnable = function() runnable_remove(id); set_state(id, 'paused') end,
    running = ask('pause'),
    planning = ask('pause'),
    paused = true,
  },
  resume = {
    paused = function() make_runnable(id, false) end,
    running = drop_pause,
    planning = drop_pause,
    runnable = true,
  },
  cancel = {
    runnable = cancel_now,
    paused = cancel_now,
    -- Waiting to be planned: at once; being planned: when its planning ends.
    planning = function() if planning_remove(id) > 0 then set_state(id, 'cancelled') else ask('cancel')() end end,
    running = ask('cancel'),
    cancelled = true,
  },
}
local state = redis.call('HGET', tkey(id), 'state')
if not state then return 'missing' end
local change = ACTIONS[action][state]
if not change then return 'invalid:' .. state end
if change ~= true then change() end
return redis.call('HGET', tkey(id), 'state')
