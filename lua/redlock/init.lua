-- redlock: Redlock distributed locks for LuaJIT, on the redlock C core.
--
--   local redlock = require "redlock"
--   local dlm = redlock.new{ servers = { "redis://127.0.0.1:7001", ... } }
--   local lock, err, detail = dlm:lock("orders:42", { ttl = 10000, wait = 5000 })
--   if lock then ...; lock:unlock() end
--
-- Misuse raises "bad argument #N to 'fn' (...)". Runtime failure returns
-- nil, err, detail: err is one of busy, unavailable, timeout, expired,
-- not held, invalid; detail says per node what happened.
--
-- This file is the module's face: its functions and the client object. The
-- rest is in modules of one concern each (docs/lua-api.md has the API):
--   redlock.check    argument checks; misuse raised at the caller
--   redlock.options  the options of new, configure and the lock calls; the environment
--   redlock.results  scratch space, status words, a failure's detail
--   redlock.batch    operations in flight together, room in a full client
--   redlock.held     the client's lists of its locks, for close()
--   redlock.keep     keep-alive for lock objects (the transport's keeper)
--   redlock.wait     retries, the sleeps between attempts, hand-off and head starts
--   redlock.lock     the attempts that make a lock, and the lock object
--   redlock.group    lock_many's attempt and the group object
--   redlock.hooks    the host's extension point (redlock.hooks)
--   redlock.stats    what the engine counted, as a table (dlm:stats())
--   redlock.metrics  the Prometheus exposition of such tables (redlock.metrics)
--   redlock.backend  the transport (libev.lua, or cosocket.lua inside nginx) and its contract

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local retry = require "redlock.retry"
local backend = require "redlock.backend"
local check = require "redlock.check"
local options = require "redlock.options"
local results = require "redlock.results"
local held = require "redlock.held"
local keep = require "redlock.keep"
local wait = require "redlock.wait"
local lock = require "redlock.lock"
local group = require "redlock.group"
local hooks = require "redlock.hooks"
local stats = require "redlock.stats"
local metrics = require "redlock.metrics"
check.ours()

local ffi_string = ffi.string
local type, error, setmetatable, select = type, error, setmetatable, select
local pcall, unpack, pairs = pcall, unpack, pairs
local argerror, show, check_self, live_client = check.argerror, check.show, check.self, check.live_client
local lock_options, keep_or_release, with_retries = options.lock_options, keep.keep_or_release, wait.with_retries
local guard, on = hooks.guard, hooks.on
local LOCK_PLAIN, LOCK_FENCED, LOCK_SHARED = lock.PLAIN, lock.FENCED, lock.SHARED
local MANY_PLAIN, MANY_FENCED, MANY_SHARED = group.PLAIN, group.FENCED, group.SHARED
local semaphore = lock.semaphore

local _M = { _VERSION = "0.4.0", retry = retry }
_M.core_version = ffi_string(C.rl_version())
_M.status_words, _M.node_words = results.status_words, results.node_words
_M._OPTIONS = options.NAMES
_M.tls_from_env = options.tls_from_env
_M.hooks = hooks.set

local dlm = {}
local dlm_mt = { __index = dlm }

local defaults = {}  -- set by redlock.configure, used by redlock.default

---------------------------------------------------------------------------
-- the module

--- Create a client. See docs/lua-api.md for the options; misuse raises.
function _M.new(opts)
    if opts == _M then argerror(1, "new", "options table expected, got the module (call redlock.new{...} with a dot)") end
    if type(opts) ~= "table" then argerror(1, "new", "options table expected, got " .. show(opts)) end
    opts = hooks.client_defaults(opts)
    local urls, servers = options.server_list("new", opts.servers) -- servers: the URL strings urls points into
    local copts, ttl = options.client_options("new", opts, #opts.servers)

    local errbuf = results.errbuf
    local client = backend.client_new(urls, #servers, copts, errbuf, results.ERR_LEN)
    if client == nil then argerror(1, "new", ffi_string(errbuf)) end

    local names = {}
    for i = 1, #servers do names[i] = ffi_string(client:node_name(i - 1)) end
    local d = {
        client = client,
        servers = servers,
        names = names,
        quorum = client:quorum(),
        ttl = ttl,
        retry = opts.retry or retry.default,
        keepalive = opts.keepalive or false,
        notify = backend.handoff == true and opts.notify ~= false, -- waiters wake on a heard release
        max_extensions = opts.max_extensions,
        options = copts,      -- kept for the keeper, which dials the same nodes
        prefix = opts.prefix, -- options.prefix points into this string: keep it as long as options
        label = opts.label,   -- and options.label into this one
        tls = opts.tls and options.copy_tls_strings(opts.tls), -- options.tls's strings point into these
        urls = urls,
        head_starts = {},     -- resource -> until when a waiter that heard our release goes first
        head_start_n = 0,     -- entries in head_starts
        head_start_skips = {}, -- resource -> { left, next }: releases that give none, after one wasted
        head_start_skip_n = 0, -- entries in head_start_skips
    }
    held.init(d)              -- live, held, held_until, ...: the locks close() releases
    keep.init(d)              -- keeper, keeper_live
    return setmetatable(d, dlm_mt)
end

--- Remember options for redlock.default() (the host sets them from its flags).
function _M.configure(opts)
    if type(opts) ~= "table" then argerror(1, "configure", "options table expected, got " .. show(opts)) end
    -- checked now, where the mistake is, rather than by default() later;
    -- kept as a copy, which the caller's later changes do not reach
    defaults = options.check_client("configure", opts)
end

-- What new() said of the configuration default() made (msg), as a refusal
-- of default(): the servers and TLS settings named by the variables that
-- gave them.
local function default_refusal(msg, servers_from_env, tls_from_env)
    msg = tostring(msg):gsub("^bad argument #1 to 'new' %((.*)%)$", "%1")
    if tls_from_env then
        for option, name in pairs(options.TLS_ENV) do msg = msg:gsub("tls%." .. option .. "%f[^%w_]", name) end
    end
    if servers_from_env and msg:find("^server") then msg = msg .. " (the servers from REDLOCK_SERVERS)" end
    return "redlock.default(): " .. msg
end

--- A client built from redlock.configure{...} or REDLOCK_SERVERS (or the
--- host's default_servers hook), and, unless configure gave tls, the
--- REDLOCK_* TLS variables; made once.
function _M.default()
    if _M._default then return _M._default end
    local opts = {}
    for k, v in pairs(defaults) do opts[k] = v end
    local tls_from_env = opts.tls == nil and _M.tls_from_env()
    opts.tls = opts.tls or tls_from_env or nil
    local servers_from_env = false
    if not opts.servers then
        local from = on.default_servers
        if from then
            opts.servers = from()
        else
            opts.servers = options.servers_from_env()
            servers_from_env = opts.servers ~= nil
        end
    end
    if not opts.servers then
        error("no servers configured: set REDLOCK_SERVERS (URLs separated by commas) or call "
            .. "redlock.configure { servers = { ... } } first (`redlock dev` starts a throwaway local "
            .. "cluster and prints the line to use)", 2)
    end
    local ok, d = pcall(_M.new, opts)
    if not ok then error(default_refusal(d, servers_from_env, tls_from_env), 2) end
    _M._default = d
    return d
end

--- The Prometheus text exposition of the clients given (closed ones are
--- left out), each engine counted once however many of them share it
--- (inside nginx, clients of one configuration do): docs/observability.md.
function _M.metrics(...)
    local tables, taken = {}, {}
    for i = 1, select("#", ...) do
        local d = select(i, ...)
        check_self(d, dlm_mt, "metrics", "a client", "redlock.metrics(dlm, ...)", i)
        local engine = d.client ~= nil and d.client:engine()
        if engine and not taken[engine] then
            taken[engine] = true
            tables[#tables + 1] = d:stats()
        end
    end
    return metrics.text(tables)
end

--- For a host: why the client d may not lock resource (its key is one of ours), or nil.
function _M._reserved(d, resource)
    return check.reserved(d, resource)
end

---------------------------------------------------------------------------
-- the client

--- The node names (URLs without passwords), in server order.
function dlm:nodes()
    check_self(self, dlm_mt, "nodes", "a client", "dlm:nodes()")
    local list = {}
    for i = 1, #self.names do list[i] = self.names[i] end
    return list
end

local stats_buf = ffi.new("rl_stats")

--- What this client counted (docs/observability.md), as a plain table; with
--- a keeper thread of its own (outside nginx), the keeper's counts added.
function dlm:stats()
    check_self(self, dlm_mt, "stats", "a client", "dlm:stats()")
    local client = live_client(self, "stats")
    client:stats(stats_buf)
    local t = stats.table(stats_buf, self.names)
    local k = self.keeper
    if k ~= nil and k.stats then
        k:stats(stats_buf)
        stats.add(t, stats.table(stats_buf, self.names))
    end
    return t
end

-- The lock calls, each run between the host's acquiring() and acquired()
-- when it set them (redlock.hooks).

-- How one lock (or lock_many) attempts, by its options.
local function kind_of(fence, shared, plain, fenced, of_shared)
    if shared then return of_shared end
    return fence and fenced or plain
end

-- After a lock call's rounds: a close() that ran meanwhile (from a
-- finalizer, once the round had come back) left what the call got on a
-- client with no connections. Nobody can release it now: it is marked
-- released by the close, forgotten, and left to its ttl, and the call
-- raises as one made on a closed client. got: a lock, a group, or nil.
local function check_not_closed_under(self, fname, got)
    if self.client ~= nil then return end
    if got then
        for _, lk in ipairs(getmetatable(got) == lock.mt and { got } or got) do
            lk.released, lk.closed = true, true
            held.forget(lk)
        end
    end
    check.live_client(self, fname) -- raises
end

local function lock_call(self, resource, opts)
    check_self(self, dlm_mt, "lock", "a client", "dlm:lock(...)")
    local ttl, wait_ms, policy, keepalive, margin, fence, shared, limit = lock_options(self, "lock", resource, opts)
    local client = live_client(self, "lock")
    local kind = limit and semaphore(limit) or kind_of(fence, shared, LOCK_PLAIN, LOCK_FENCED, LOCK_SHARED)
    local lk, err, detail = with_retries(self, client, kind, resource, ttl, policy, wait_ms)
    check_not_closed_under(self, "lock", lk)
    if lk and keepalive then keep_or_release({ lk }, margin) end
    return lk, err, detail
end

local function try_lock_call(self, resource, opts)
    check_self(self, dlm_mt, "try_lock", "a client", "dlm:try_lock(...)")
    local ttl, _, _, keepalive, margin, fence, shared, limit = lock_options(self, "try_lock", resource, opts)
    local kind = limit and semaphore(limit) or kind_of(fence, shared, LOCK_PLAIN, LOCK_FENCED, LOCK_SHARED)
    local lk, err, detail = kind.try(self, live_client(self, "try_lock"), resource, ttl)
    check_not_closed_under(self, "try_lock", lk)
    if lk and keepalive then keep_or_release({ lk }, margin) end
    return lk, err, detail
end

local function lock_many_call(self, resources, opts)
    check_self(self, dlm_mt, "lock_many", "a client", "dlm:lock_many(...)")
    check.resources(self, "lock_many", resources)
    local ttl, wait_ms, policy, keepalive, margin, fence, shared = lock_options(self, "lock_many", resources[1], opts)
    local client = live_client(self, "lock_many")
    local locks, err, detail = with_retries(self, client, kind_of(fence, shared, MANY_PLAIN, MANY_FENCED, MANY_SHARED),
                                            resources, ttl, policy, wait_ms)
    check_not_closed_under(self, "lock_many", locks)
    if locks and keepalive then keep_or_release(locks, margin) end
    return locks, err, detail
end

--- Acquire resource, retrying under the policy. Returns a lock or nil, err, detail.
function dlm:lock(resource, opts)
    if on.guarded then return guard(lock_call, self, resource, opts) end
    return lock_call(self, resource, opts)
end

--- One attempt to acquire resource.
function dlm:try_lock(resource, opts)
    if on.guarded then return guard(try_lock_call, self, resource, opts) end
    return try_lock_call(self, resource, opts)
end

--- Acquire every resource or none; all requests in flight together.
--- Returns a list of locks (with :unlock(), :extend(), :valid()) or nil, err, detail.
function dlm:lock_many(resources, opts)
    if on.guarded then return guard(lock_many_call, self, resources, opts) end
    return lock_many_call(self, resources, opts)
end

local function adopt_call(self, resource, value, opts)
    check_self(self, dlm_mt, "adopt", "a client", "dlm:adopt(...)")
    local ttl, keepalive, margin, slot = options.adopt_options(self, "adopt", resource, value, opts)
    local lk, err, detail = lock.adopt(self, live_client(self, "adopt"), resource, value, ttl, slot)
    check_not_closed_under(self, "adopt", lk)
    if lk and keepalive then keep_or_release({ lk }, margin) end
    return lk, err, detail
end

--- Take over a lock acquired elsewhere (another process handed over its
--- resource and value): one extension to the ttl, then a lock like any
--- other (opts.slot: the slot of a semaphore's that value holds). Returns
--- a lock or nil, err, detail ("not held": value is not the holder of
--- resource, or of that slot, on a quorum).
function dlm:adopt(resource, value, opts)
    if on.guarded then return guard(adopt_call, self, resource, value, opts) end
    return adopt_call(self, resource, value, opts)
end

local function pack(...)
    return { n = select("#", ...), ... }
end

-- Why lk, with_lock's lock, is no longer held now that its function has
-- returned, or nil: it is valid, or the function released it itself (a
-- release is no loss, nor is one that failed while the lock was valid: it
-- ended the lock's validity, since it may have run on the nodes).
local function lost_by_now(lk)
    if lk.lost_at_close then return "it was no longer held when its client was closed" end
    if lk.released or lk.unlock_failed or lk:valid() then return nil end
    if lk.kept ~= nil then return "keep-alive could not extend it in time, or found it gone" end
    return "its validity ran out before the function returned"
end

--- Acquire resource, run fn(lock, ...), always release. Keep-alive is on
--- unless opts.keepalive == false. Returns fn's results, or nil, err, detail
--- when the lock was not acquired; an error in fn is raised again after
--- release. When the lock was lost before fn returned (lock:valid() false
--- then, or the release found it held on no quorum), raises "lock on
--- '<resource>' was lost while the function ran: <why>" after the release
--- instead of returning: fn's work may have overlapped another holder's. A
--- release that fails otherwise (nodes unreachable) is no loss: the lock
--- was valid, and runs out on the nodes that kept it.
function dlm:with_lock(resource, opts, fn, ...)
    check_self(self, dlm_mt, "with_lock", "a client", "dlm:with_lock(...)")
    lock_options(self, "with_lock", resource, opts)
    live_client(self, "with_lock")
    if type(fn) ~= "function" then argerror(3, "with_lock", "function expected, got " .. show(fn)) end
    local lock_opts = { keepalive = true }
    if opts then
        for k, v in pairs(opts) do lock_opts[k] = v end
    end
    local lk, err, detail = self:lock(resource, lock_opts)
    if not lk then return nil, err, detail end
    -- its owner for the keeper: a table of this frame's, which ends with
    -- the request however fn ends it, whatever fn does to ngx.ctx
    local owner = keep.own(lk, {})
    local out = pack(pcall(fn, lk, ...))
    local lost = lost_by_now(lk)
    -- fn's own release, failed here, may have deleted our value there since
    local fn_released = lk.release_sent
    -- (a release that failed: the keeper releases a kept lock in the background)
    local _, why = lk:unlock()
    if owner ~= nil then keep.own(lk, nil) end -- (the frame holds owner until here)
    if not out[1] then error(out[2], 0) end
    if not lost and why == "not held" and not fn_released then
        lost = "the release found it held on no quorum (it had expired or been taken over)"
    end
    if lost then error("lock on '" .. resource .. "' was lost while the function ran: " .. lost, 2) end
    return unpack(out, 2, out.n)
end

--- Release every lock still held through this client (kept or not), then
--- close every connection now instead of at garbage collection. Bounded in
--- time: the releases go out together and end within the node timeout (more
--- than a client can have in flight wait for room, within one node and
--- connect timeout more: see redlock.batch); a release waiting for a node's
--- connection gets the connect timeout and the reconnect cap (1 s) more; the
--- keeper gets a second for what it still releases itself (dropped locks). A lock() or lock_many()
--- retrying on this client raises "'lock' on a closed client" instead of
--- trying again. Closing twice is fine.
function dlm:close()
    check_self(self, dlm_mt, "close", "a client", "dlm:close()")
    local client = self.client
    if client == nil then return end
    check.phase() -- before any lock is marked released
    self.client = nil -- first: whatever runs from here on sees the client closed
    -- every lock not unlocked, its object alive or not (kept ones whose
    -- objects were collected are the keeper's, below)
    held.release_all(self, client, keep.stop)
    keep.close(self)
    client:free()
end

return _M
