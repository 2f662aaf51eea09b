-- redlock.held: the client's lists of its locks, for close(). close()
-- releases every lock not unlocked, whether or not its object is still
-- alive: `live` holds the lock objects made (weakly), `held` the value ->
-- resource of each lock neither unlocked nor kept, and `held_until` when its
-- key is gone from every node by itself.

local C = require("redlock.cdefs").lib
local batch = require "redlock.batch"
require("redlock.check").ours()

local pairs, setmetatable = pairs, setmetatable
local now = C.rl_now_ms
local RELEASE = C.RL_OP_RELEASE

local _M = {}

local WEAK_KEYS = { __mode = "k" }
-- The list is swept of expired locks when it has doubled since the last
-- sweep, and not before it holds this many.
local HELD_PRUNE_MIN = 256

--- The fields a new client starts with (merged into its table by redlock.new).
function _M.init(d)
    d.live = setmetatable({}, WEAK_KEYS) -- locks made here (released or not), for close()
    d.held = {}                -- value -> resource of each lock not unlocked nor kept, for close(),
    d.held_until = {}          -- value -> when its key is gone from every node by itself,
    d.held_slot = {}           -- value -> the slot of a semaphore's lock (none for a lock),
    d.held_n = 0               -- so that close() releases locks whose objects were collected
    d.held_prune_at = HELD_PRUNE_MIN
    return d
end

-- Drop the listed locks whose keys are gone by themselves; then wait for
-- the list to double before looking again.
local function prune(d)
    local t, n = now(), 0
    for v, until_ in pairs(d.held_until) do
        if until_ <= t then d.held[v], d.held_until[v], d.held_slot[v] = nil, nil, nil else n = n + 1 end
    end
    d.held_n = n
    d.held_prune_at = n * 2 > HELD_PRUNE_MIN and n * 2 or HELD_PRUNE_MIN
end

--- A lock not kept and not unlocked is listed until its key has left every
--- node by itself: started + ttl, stretched by the drift allowance. (A
--- dropped lock is not released at collection: it runs out its ttl unless
--- close() or unlock() runs first.)
local function hold_until(lk, started, ttl)
    local d = lk.dlm
    local until_ = started + ttl * (1 + d.options.drift_factor) + 2
    local v = lk.value
    local old = d.held_until[v]
    if old == nil then
        d.held[v], d.held_slot[v] = lk.resource, lk.slot
        d.held_n = d.held_n + 1
    elseif old > until_ then
        return
    end
    d.held_until[v] = until_
end
_M.hold_until = hold_until

--- A new lock: listed among the client's locks.
function _M.add(lk, started, ttl)
    local d = lk.dlm
    d.live[lk] = true
    hold_until(lk, started, ttl)
    if d.held_n >= d.held_prune_at then prune(d) end
end

--- Value v is no longer listed (its lock is kept, or released).
local function unhold(d, v)
    if d.held[v] ~= nil then
        d.held[v], d.held_until[v], d.held_slot[v] = nil, nil, nil
        d.held_n = d.held_n - 1
    end
end
_M.unhold = unhold

--- A lock whose release has gone out: close() has nothing more to do for it.
function _M.forget(lk)
    unhold(lk.dlm, lk.value)
    lk.dlm.live[lk] = nil
end

-- close()'s releases (a batch's functions, made once: see redlock.batch's run).
local RELEASE_HELD = {
    begin = function(s, i)
        local resource, slot = s.resources[i], s.slots[i]
        if slot > 0 then
            return s.client:begin_on_slot(RELEASE, resource, #resource, slot, s.values[i], 0), #resource
        end
        return s.client:begin_release(resource, #resource, s.values[i]), #resource
    end,
    done = batch.ignore,
}

--- For close(): every lock object made and not released yet is marked
--- released (stop(lk) first: the keeper lets go of it), and one that was
--- lost by then stays lost (lk.lost_at_close); then every lock listed, its
--- object alive or not, is released, all in flight together, and the lists
--- start empty.
function _M.release_all(d, client, stop)
    for lk in pairs(d.live) do
        if not lk.released then
            local lost = lk:lost()
            stop(lk)
            lk.released, lk.closed, lk.lost_at_close = true, true, lost or nil
        end
    end
    -- a copy: making room may yield (inside nginx), and another coroutine's
    -- lock would then change the list under pairs()
    local values, resources, slots, held_until, t = {}, {}, {}, d.held_until, now()
    for value, resource in pairs(d.held) do
        if held_until[value] > t then
            local n = #values + 1
            values[n], resources[n], slots[n] = value, resource, d.held_slot[value] or 0
        end
    end
    batch.run(d, client, #values, RELEASE_HELD, { client = client, values = values, resources = resources,
        slots = slots })
    d.live, d.held, d.held_until, d.held_slot, d.held_n = setmetatable({}, WEAK_KEYS), {}, {}, {}, 0
end

return _M
