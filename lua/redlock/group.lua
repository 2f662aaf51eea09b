-- redlock.group: many locks at once (lock_many). One all-or-nothing
-- attempt with every acquire in flight together, and the group it makes: a
-- list of locks with unlock, extend and valid of its own.

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local check = require "redlock.check"
local results = require "redlock.results"
local batch = require "redlock.batch"
local held = require "redlock.held"
local lock = require "redlock.lock"
local wait = require "redlock.wait"
check.ours()

local ffi_string = ffi.string
local setmetatable = setmetatable
local OK = C.RL_STATUS_OK
local failure, refusal = results.failure, results.refusal
local run, ignore = batch.run, batch.ignore
local forget = held.forget
local new_lock, after_release = lock.new, lock.after_release
local mark_head_start = wait.mark_head_start
local check_self, raise, live_client, check_phase = check.self, check.raise, check.live_client, check.phase

local _M = {}

local group = {}
local group_mt = { __index = group }
_M.mt = group_mt

-- Release the locks of a batch that failed, all in flight together. One
-- that cannot even begin stays listed for close() (and its ttl). Quietly:
-- nobody is woken by a lock given back unused, neither the other waiters of
-- the resource nor this waiter itself, which would otherwise hear its own
-- releases and try again at once, over and over (redlock.h, "Hand-off").
-- (The batches' functions take their call's state as s, and are made once:
-- see redlock.batch's run.)
local GIVE_BACK = {
    begin = function(s, i)
        local lk = s.locks[i]
        lk.released = true
        local id = s.client:begin_release_quiet(lk.resource, #lk.resource, lk.value)
        if id >= 0 then forget(lk) end
        return id, #lk.resource
    end,
    done = ignore,
}

local function release_all_started(d, client, locks)
    run(d, client, #locks, GIVE_BACK, { client = client, locks = locks })
end

-- One attempt's acquires (attempt_many_with): s.locks gets the granted, s.err
-- and s.detail the first failure, s.unknown why a result never came.
local ACQUIRE = {
    begin = function(s, i)
        local name = s.resources[i]
        return s.begin(s.client, name, #name, s.ttl), #name
    end,
    done = function(s, i, got, r)
        if not got then
            -- no result (inside nginx: the hub gave up): not a lock
            s.unknown = s.unknown or ffi_string(s.client:errstr())
            s.err = s.err or "unavailable"
        elseif r.status == OK then
            local locks = s.locks
            locks[#locks + 1] = new_lock(s.d, s.resources[i], s.ttl, s.started, r)
        elseif not s.err then
            local _
            _, s.err, s.detail = failure(s.d, r)
            s.detail.resource = s.resources[i]
        end
    end,
    stop = function(s) return s.err ~= nil end,
}

-- One all-or-nothing attempt: every acquire in flight together (begin:
-- the client's begin_acquire, begin_acquire_fenced or begin_acquire_shared). With every operation
-- slot taken, the acquires begun so far are collected to make room; after a
-- refusal the rest are not begun.
local function attempt_many_with(d, client, resources, ttl, begin)
    local started = C.rl_now_ms()
    local s = { d = d, client = client, resources = resources, ttl = ttl, begin = begin, started = started, locks = {} }
    local unknown = run(d, client, #resources, ACQUIRE, s) or s.unknown
    local locks = s.locks
    if unknown then
        release_all_started(d, client, locks)
        raise("redlock: " .. unknown)
    end
    if s.err then
        release_all_started(d, client, locks)
        return nil, s.err, s.detail
    end
    -- every lock must still be valid now: a lock's validity counts from the
    -- call's start, and a batch that takes longer outlives its first locks,
    -- which somebody else may then hold
    local now = C.rl_now_ms()
    for i = 1, #locks do
        if locks[i].valid_until <= now then
            release_all_started(d, client, locks)
            return refusal(d, "timeout", ("the batch took %d ms, and the lock on '%s' ran out before the last was "
                .. "granted (ttl %d ms): lock fewer names at once, or give a longer ttl")
                :format(now - started, locks[i].resource, ttl))
        end
    end
    return setmetatable(locks, group_mt)
end

local function attempt_many(d, client, resources, ttl)
    return attempt_many_with(d, client, resources, ttl, client.begin_acquire)
end

local function attempt_many_fenced(d, client, resources, ttl)
    return attempt_many_with(d, client, resources, ttl, client.begin_acquire_fenced)
end

local function attempt_many_shared(d, client, resources, ttl)
    return attempt_many_with(d, client, resources, ttl, client.begin_acquire_shared)
end

-- How lock_many attempts (redlock.wait): no queued form.
_M.PLAIN = { try = attempt_many }
_M.FENCED = { try = attempt_many_fenced }
_M.SHARED = { try = attempt_many_shared }

-- A group's releases (group:unlock): s.ok, s.err, s.detail the first
-- failure, s.missing why a result never came.
local RELEASE = {
    begin = function(s, i)
        local lk = s.group[i]
        if lk.released then return nil end
        return s.client:begin_release(lk.resource, #lk.resource, lk.value), #lk.resource
    end,
    done = function(s, i, got, r)
        local lk = s.group[i]
        if not got then
            s.missing = s.missing or ffi_string(s.client:errstr())
            return
        end
        local sent_before = lk.release_sent
        after_release(lk, s.started, r.status)
        if r.status == OK then
            if r.heard > 0 then mark_head_start(s.d, lk.resource) end
        elseif s.ok then
            s.ok, s.err, s.detail = failure(s.d, r)
            s.detail.resource = lk.resource
            if r.status == C.RL_STATUS_NOT_HELD and sent_before then s.detail.message = lock.AGAIN_NOT_HELD end
        end
    end,
}

--- Release every lock of the group that is not released yet; true, or nil,
--- err, detail of the first failure. As with one lock: a lock whose release
--- failed may be unlocked again, and a group already unlocked returns nil,
--- "invalid", detail.
function group:unlock()
    check_self(self, group_mt, "unlock", "a group of locks", "locks:unlock()")
    local d = self[1].dlm
    local any = false
    for i = 1, #self do
        if not self[i].released then any = true end
    end
    if not any then return refusal(d, "invalid", "the locks were already unlocked") end
    check_phase() -- a phase without cosockets: say so first (release refuses anyway)
    local client = live_client(d, "unlock")
    local s = { d = d, client = client, group = self, started = C.rl_now_ms(), ok = true }
    local refused = run(d, client, #self, RELEASE, s) or s.missing
    if refused then raise("redlock: " .. refused) end
    return s.ok, s.err, s.detail
end

--- Extend every lock of the group; true, or the first failure.
function group:extend(ttl)
    check_self(self, group_mt, "extend", "a group of locks", "locks:extend(ttl)")
    for i = 1, #self do
        local ok, err, detail = self[i]:extend(ttl)
        if not ok then return nil, err, detail end
    end
    return true
end

--- True while every lock of the group is valid.
function group:valid()
    check_self(self, group_mt, "valid", "a group of locks", "locks:valid()")
    for i = 1, #self do
        if not self[i]:valid() then return false end
    end
    return true
end

return _M
