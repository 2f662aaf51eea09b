-- redlock.lock: one lock. The attempts that make one (plain, fenced, shared,
-- as a queued waiter, or a slot of a semaphore; or an adoption), the lock
-- object and its methods (remaining, valid, lost, check, extend, unlock). A
-- semaphore's lock is a lock on its slot's key: lk.slot says which, and its
-- release and extensions name the slot (client:on_slot).

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local check = require "redlock.check"
local results = require "redlock.results"
local batch = require "redlock.batch"
local held = require "redlock.held"
local keep = require "redlock.keep"
local wait = require "redlock.wait"
local max_margin = require("redlock.options").max_margin
check.ours()

local ffi_string = ffi.string
local floor = math.floor
local setmetatable, error = setmetatable, error
local now = C.rl_now_ms
local OK, RL_OK = C.RL_STATUS_OK, C.RL_OK
local RELEASE, EXTEND = C.RL_OP_RELEASE, C.RL_OP_EXTEND
local VALUE_LEN = C.RL_VALUE_LEN
local int64_t = ffi.typeof("int64_t")
local SHARED_CHAR = ("s"):byte() -- a shared hold's value ends with it (core/src/shared.h)
local take, give = results.take, results.give
local detail_of, failure, failure_given, refusal = results.detail_of, results.failure, results.failure_given,
    results.refusal
local again_when_full = batch.again_when_full
local hold_until, forget = held.hold_until, held.forget
local kept_state, keep_update, stop_keeping, let_go = keep.state, keep.update, keep.stop, keep.let_go
local mark_head_start = wait.mark_head_start
local check_self, check_ms, argerror, live_client, check_phase =
    check.self, check.ms, check.argerror, check.live_client, check.phase

local _M = {}

local lock = {}
local lock_mt = { __index = lock }
_M.mt = lock_mt

-- A fenced lock's token as an int64_t cdata of its own (exact up to 2^63-1,
-- where a Lua number stops at 2^53; made int64_t, not the struct field's
-- long long, so that string.format's %d takes it too), and its decimal
-- text; nil, nil for an unfenced lock.
local function token_of(r)
    if r.token == 0 then return nil, nil end
    local t = int64_t(r.token)
    return t, ("%d"):format(t)
end

--- When the validity of a grant or extension (round r, begun at started)
--- runs out. The validity is what was left at the decision (ttl less the
--- round's time and the drift allowance), so it counts from the decision:
--- started + the round's time. (The keys were set no earlier than started
--- and last ttl from then: this is started + ttl less the drift allowance.)
local function validity_end(started, r)
    return started + r.elapsed_ms + floor(r.validity_ms)
end

--- The lock that round r granted on client d (started: rl_now_ms before it).
local function new_lock(d, resource, ttl, started, r)
    local token, token_string = token_of(r)
    local lk = setmetatable({
        dlm = d,
        resource = resource,
        value = ffi_string(r.value, VALUE_LEN),
        ttl = ttl,
        validity = floor(r.validity_ms), -- whole ms: a fraction less, never more
        votes = r.ok,         -- nodes that had granted it when quorum was reached
        token = token,        -- a fenced lock's fencing token (int64_t cdata), else nil
        token_string = token_string, -- the same in decimal (for JSON, headers, the environment)
        slot = r.slot ~= 0 and r.slot or nil, -- a semaphore's lock: the slot held (1 to its limit)
        shared = r.value[C.RL_VALUE_LEN - 1] == SHARED_CHAR, -- a shared (read) hold
        valid_until = validity_end(started, r),
        extensions = 0,
        released = false,
        kept = nil,
    }, lock_mt)
    held.add(lk, started, ttl)
    return lk
end
_M.new = new_lock

-- One attempt with the client's acquire (plain, fenced or queued). Returns a lock,
-- or nil, err, detail.
local function attempt_by(d, client, resource, ttl, acquire)
    local started, r = now(), take()
    local rc = acquire(client, resource, #resource, ttl, r)
    if rc ~= RL_OK then again_when_full(d, client, rc, acquire, resource, #resource, ttl, r) end
    if r.status ~= OK then return failure_given(d, r) end
    local lk = new_lock(d, resource, ttl, started, r)
    give(r)
    return lk
end

local function attempt(d, client, resource, ttl)
    return attempt_by(d, client, resource, ttl, client.acquire)
end

-- A fenced lock: the same, with its token committed.
local function attempt_fenced(d, client, resource, ttl)
    return attempt_by(d, client, resource, ttl, client.acquire_fenced)
end

-- A waiter's attempt: the same, and refused, the client joins the nodes'
-- queues of waiters, so that a release wakes it alone (redlock.h, "Hand-off").
local function attempt_queued(d, client, resource, ttl)
    return attempt_by(d, client, resource, ttl, client.acquire_queued)
end

-- A shared (read) hold: no queued form, its waiters hear the broadcast.
local function attempt_shared(d, client, resource, ttl)
    return attempt_by(d, client, resource, ttl, client.acquire_shared)
end

-- How a lock call attempts (redlock.wait): try(d, client, resource, ttl),
-- and as a queued waiter when it has a queued form (a writer that waits
-- that way also marks its intent while readers hold: redlock.h).
_M.PLAIN = { try = attempt, queued = attempt_queued }
_M.FENCED = { try = attempt_fenced }
_M.SHARED = { try = attempt_shared }

-- A semaphore of limit slots: one attempt takes one slot (a waiter's, with
-- its ticket: its place in the queue of the semaphore's waiters, which it
-- joins when refused; 0: no queue).
local function attempt_slot(d, client, resource, ttl, limit, ticket)
    local started, r = now(), take()
    local rc = client:acquire_slot(resource, #resource, limit, ttl, ticket, r)
    if rc ~= RL_OK then
        again_when_full(d, client, rc, client.acquire_slot, resource, #resource, limit, ttl, ticket, r)
    end
    if r.status ~= OK then return failure_given(d, r) end
    local lk = new_lock(d, resource, ttl, started, r)
    give(r)
    client:slot_taken(resource, #resource, lk.value, lk.valid_until)
    return lk
end

local semaphores = {} -- limit -> how its lock calls attempt (made once per limit)

--- How a lock call on a semaphore of limit slots attempts (as _M.PLAIN; a
--- waiter's attempts carry the ticket redlock.wait gives them).
function _M.semaphore(limit)
    local kind = semaphores[limit]
    if kind == nil then
        kind = {
            slots = limit,
            try = function(d, client, resource, ttl) return attempt_slot(d, client, resource, ttl, limit, 0) end,
            queued = function(d, client, resource, ttl, ticket)
                return attempt_slot(d, client, resource, ttl, limit, ticket)
            end,
        }
        semaphores[limit] = kind
    end
    return kind
end

-- The release (or, ttl given, the extension) of value's hold of resource:
-- on slot's key for a semaphore's (slot: nil for a lock). The round's
-- result goes into out (a buffer of results.take).
local function on_key(d, client, kind, r, slot, value, ttl, out)
    local rc
    if slot then
        rc = client:on_slot(kind, r, #r, slot, value, ttl or 0, out)
        if rc ~= RL_OK then again_when_full(d, client, rc, client.on_slot, kind, r, #r, slot, value, ttl or 0, out) end
    elseif kind == EXTEND then
        rc = client:extend(r, #r, value, ttl, out)
        if rc ~= RL_OK then again_when_full(d, client, rc, client.extend, r, #r, value, ttl, out) end
    else
        rc = client:release(r, #r, value, out)
        if rc ~= RL_OK then again_when_full(d, client, rc, client.release, r, #r, value, out) end
    end
end

-- Whether a node of round r may have done what it was asked: it said so,
-- or gave no answer by the decision (pending, timed out, its connection
-- lost), so that it may yet. Only a node that refused did not.
local function some_node_may_have(r)
    for i = 0, r.nodes - 1 do
        if r.node[i].state ~= C.RL_NODE_TAKEN then return true end
    end
    return false
end

--- A lock acquired elsewhere (value: its holder's; slot: a semaphore's
--- slot it holds, or nil), taken over by one extension to ttl: the lock it
--- makes, with the validity that extension left, or nil, err, detail ("not
--- held" when value is not on a quorum). A value on no quorum is nobody's
--- lock: the nodes of a minority that took the extension, also after the
--- round was decided, would keep it for ttl (blocking the resource there),
--- so it is released on every node unless every node refused it.
function _M.adopt(d, client, resource, value, ttl, slot)
    local started, r = now(), take()
    on_key(d, client, EXTEND, resource, slot, value, ttl, r)
    if r.status == OK then
        local lk = new_lock(d, resource, ttl, started, r)
        give(r)
        return lk
    end
    local extended = r.status == C.RL_STATUS_NOT_HELD and some_node_may_have(r)
    local _, err, detail = failure(d, r)
    if extended then on_key(d, client, RELEASE, resource, slot, value, nil, r) end
    give(r)
    return nil, err, detail
end

--- Milliseconds of validity left (<= 0 once it has run out).
function lock:remaining()
    check_self(self, lock_mt, "remaining", "a lock", "lock:remaining()")
    if self.released then return 0 end
    kept_state(self)
    return self.valid_until - now()
end

--- True while the lock is held: not unlocked, not lost, validity left.
function lock:valid()
    check_self(self, lock_mt, "valid", "a lock", "lock:valid()")
    return not self.released and not self:lost() and self:remaining() > 0
end

--- True once the lock is known to be gone: an extension or unlock found our
--- value gone, keep-alive failed, or validity (less a keep-alive margin) ran
--- out. False for a lock that was unlocked (check() says so), unless its
--- client's close() released it once it was lost.
function lock:lost()
    check_self(self, lock_mt, "lost", "a lock", "lock:lost()")
    if self.released then return self.lost_at_close == true end
    local state = kept_state(self)
    if state ~= nil then return state == C.RL_KEEP_LOST end
    return self.valid_until - (self.margin or 0) - now() <= 0
end

--- Raise "unlocked: ..." if the lock was released (by unlock() or its
--- client's close()), "lost: ..." if it has been lost; return the lock
--- otherwise.
function lock:check()
    check_self(self, lock_mt, "check", "a lock", "lock:check()")
    if self.lost_at_close then
        error("lost: the lock on '" .. self.resource .. "' was no longer held when its client was closed", 2)
    end
    if self.released then
        error("unlocked: the lock on '" .. self.resource .. "' was released"
            .. (self.closed and " when its client was closed" or ""), 2)
    end
    if self:lost() then
        error("lost: the lock on '" .. self.resource .. "' is no longer held"
            .. (self.unlock_failed and " (an unlock of it failed: its release may have run on the nodes)" or ""), 2)
    end
    return self
end

-- After an extend that was sent and failed, the lock is held no longer
-- than both what it had and what the round may have left: nodes that took
-- the new ttl (no earlier than started) drop the key by started + the new
-- ttl less the drift allowance, and "not held" means our value is gone from
-- too many nodes for a quorum.
local function after_failed_extend(lk, ttl, started, r)
    local until_
    if r.status == C.RL_STATUS_NOT_HELD then
        until_ = started
    else
        until_ = started + ttl - (ttl * lk.dlm.options.drift_factor + 2)
    end
    kept_state(lk)  -- a kept lock: start from the keeper's latest validity
    if until_ < lk.valid_until then lk.valid_until = until_ end
    -- The keeper goes on counting the lower validity, with the shorter of
    -- the two ttls: a node this round had not reached may run it after the
    -- keeper's next extension (which goes out on connections of its own),
    -- and keep the key only this ttl from then on.
    if lk.kept ~= nil and ttl < lk.ttl then lk.ttl = ttl end
    keep_update(lk, lk.ttl, started)
end

--- Extend the lock to ttl ms (default: its ttl) from now. true, nil, detail
--- or nil, err, detail. Decided at quorum: a node that had not answered by
--- then is "pending" in detail (it is still extended if it holds our value).
function lock:extend(ttl)
    check_self(self, lock_mt, "extend", "a lock", "lock:extend(ttl)")
    if ttl == nil then ttl = self.ttl else check_ms(1, "extend", "ttl", ttl) end
    if self.kept ~= nil and max_margin(self.dlm, ttl) < self.margin then
        argerror(1, "extend", ("ttl must leave a validity above the lock's keep-alive margin (%d ms), got %d")
            :format(self.margin, ttl))
    end
    if self.released then return refusal(self.dlm, "invalid", "the lock was unlocked") end
    local max = self.dlm.max_extensions
    if max and self.extensions >= max then
        return refusal(self.dlm, "invalid", ("extension limit (%d) reached"):format(max))
    end
    if self:lost() then
        if self.release_sent then
            return refusal(self.dlm, "expired", "the lock was lost: an unlock of it failed, and its release may have"
                .. " run on the nodes")
        end
        -- lk.margin is set once keep-alive takes the lock, and stays; without
        -- keep-alive a lock is lost exactly when no validity is left
        if self.margin == nil then return refusal(self.dlm, "expired", "no validity left to extend") end
        return refusal(self.dlm, "expired", "the lock was lost: keep-alive found it gone or could not extend it in time")
    end
    local client = live_client(self.dlm, "extend")
    local started, r = now(), take()
    on_key(self.dlm, client, EXTEND, self.resource, self.slot, self.value, ttl, r)
    -- nodes that took it keep the key up to the new ttl from here
    if self.kept == nil then hold_until(self, started, ttl) end
    if r.status ~= OK then
        after_failed_extend(self, ttl, started, r)
        return failure_given(self.dlm, r)
    end
    self.extensions = self.extensions + 1
    self.ttl = ttl
    self.validity = floor(r.validity_ms)
    self.valid_until = validity_end(started, r)
    local detail = detail_of(self.dlm, r)
    give(r)
    -- the keeper goes on with this ttl, not the one it was handed; if it
    -- found the lock lost while the round was out, this extension takes it
    -- back, unless it leaves no validity above the margin
    if not keep_update(self, ttl, started) then
        detail.status, detail.message = "expired", "the lock was lost while the extension was out: keep-alive found "
            .. "it gone or too little validity was left above the margin"
        return nil, "expired", detail
    end
    return true, nil, detail
end

--- The release of lk, begun at started, came back with status (lk.release_sent
--- says one was). Done: lk is released (keep-alive lets go of it). Anything
--- else: the release may have run on some nodes from started on (a failed
--- unlock is not undone), and "not held" says our value is gone from too
--- many nodes already; either way lk is lost from started. A kept lock is
--- then extended no more and its keeper releases it in the background, as
--- it does a lock whose object was collected; one not kept stays listed
--- for close(). Either way unlock() may be tried again.
function _M.after_release(lk, started, status)
    lk.release_sent = true -- (whatever it says, a release may have run on the nodes)
    if status == OK then
        stop_keeping(lk)
        lk.released = true
        forget(lk)
        return
    end
    kept_state(lk) -- (a kept lock: its keeper's latest validity)
    let_go(lk)
    -- a lock still valid when the failed release began was ended by it
    -- (check() says so; with_lock counts it a release, not a loss)
    if status ~= C.RL_STATUS_NOT_HELD and lk.valid_until - (lk.margin or 0) > started then lk.unlock_failed = true end
    if started < lk.valid_until then lk.valid_until = started end
end
local after_release = _M.after_release

-- What an unlock that found our value on no quorum says after an earlier
-- unlock of the same lock failed.
_M.AGAIN_NOT_HELD = "an earlier unlock of this lock failed, and its release may have reached the nodes since (or the"
    .. " lock expired): our value is on no quorum"

--- Release the lock on every node. true, nil, detail once a quorum deleted
--- our value, or nil, err, detail ("not held" when our value was no longer
--- on a quorum: it expired or was taken over). Decided at quorum: a node that
--- had not answered by then is "pending" in detail, and the client sends it
--- the rest (a late NOSCRIPT gets its EVAL) on its next calls, or close().
--- After a failure the lock is lost (its release may have run on some
--- nodes; keep-alive stops) and may be unlocked again (say, once nodes are
--- back) to finish the release. Once it succeeded, unlocking again returns
--- nil, "invalid", detail.
function lock:unlock()
    check_self(self, lock_mt, "unlock", "a lock", "lock:unlock()")
    if self.released then
        return refusal(self.dlm, "invalid", self.closed and "the lock was released when its client was closed"
            or "the lock was already unlocked")
    end
    if self.kept ~= nil then check_phase() end -- a phase without cosockets: say so first (release refuses anyway)
    local client = live_client(self.dlm, "unlock")
    local started, r = now(), take()
    local sent_before = self.release_sent
    on_key(self.dlm, client, RELEASE, self.resource, self.slot, self.value, nil, r)
    local status, heard = r.status, r.heard
    if status ~= OK then
        after_release(self, started, status)
        local _, err, detail = failure_given(self.dlm, r)
        if status == C.RL_STATUS_NOT_HELD and sent_before then detail.message = _M.AGAIN_NOT_HELD end
        return nil, err, detail
    end
    local detail = detail_of(self.dlm, r)
    give(r)
    after_release(self, started, status)
    -- a semaphore's nodes keep their waiters' turns themselves: a
    -- releaser that asks again at once is refused while it is not its turn
    if heard > 0 and not self.slot then mark_head_start(self.dlm, self.resource) end
    return true, nil, detail
end

return _M
