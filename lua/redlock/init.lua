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

local ffi = require "ffi"
local cdefs = require "redlock.cdefs"
local retry = require "redlock.retry"

-- Inside nginx a lock call must never block the worker: the engine is driven
-- over cosockets there, and over the core's own libev sockets everywhere else.
local in_nginx = type(ngx) == "table" and type(ngx.socket) == "table" and type(ngx.get_phase) == "function"
local backend = require(in_nginx and "redlock.cosocket" or "redlock.libev")

local C = cdefs.lib
local ffi_string, ffi_new, ffi_gc = ffi.string, ffi.new, ffi.gc
local type, error, setmetatable, tostring, select = type, error, setmetatable, tostring, select
local pcall, unpack = pcall, unpack

local _M = { _VERSION = "0.3.0", retry = retry }
_M.core_version = ffi_string(C.rl_version())

local dlm = {}
local dlm_mt = { __index = dlm }
local lock = {}
local lock_mt = { __index = lock }
local group = {}
local group_mt = { __index = group }

local OK, RL_OK, RL_ERR_FULL = C.RL_STATUS_OK, C.RL_OK, C.RL_ERR_FULL
local VALUE_LEN = C.RL_VALUE_LEN
-- The words come from the core (words.c), read once into tables for the hot path.
local STATUS_WORDS, NODE_WORDS = {}, {}
for code = C.RL_STATUS_PENDING, C.RL_STATUS_NOT_HELD do STATUS_WORDS[code] = ffi_string(C.rl_status_word(code)) end
for code = C.RL_NODE_PENDING, C.RL_NODE_TIMEOUT do NODE_WORDS[code] = ffi_string(C.rl_node_state_word(code)) end
_M.status_words, _M.node_words = STATUS_WORDS, NODE_WORDS

-- Scratch space reused by every call (calls are synchronous).
local result = ffi_new("rl_result")
local errbuf = ffi_new("char[?]", C.RL_ERR_LEN)
local until_buf = ffi_new("double[1]")
local guard_t = ffi.typeof("struct { int id; }")  -- a kept lock's finalizer rides on one of these
local int64_t = ffi.typeof("int64_t")

local defaults = {}  -- set by redlock.configure, used by redlock.default
local RETRY_UNTIL_WAIT = retry.forever()  -- `wait` without `retry`: try until wait runs out
local WEAK_KEYS = { __mode = "k" }
-- The longest close(), or a keeper collected with locks still kept, waits for
-- the keeper's releases.
local RELEASE_BOUND_MS = 1000
-- The client's list of locks for close() is swept of expired ones when it
-- has doubled since the last sweep, and not before it holds this many.
local HELD_PRUNE_MIN = 256
-- Operations in flight on one client at most (ids % RL_ID_SLOTS differ).
local ID_SLOTS = C.RL_ID_SLOTS

---------------------------------------------------------------------------
-- argument checks
--
-- Misuse raises at the line of the code that called into this module: the
-- error level is found by walking the stack to the first frame outside this
-- file, so a check may sit at any depth and with_lock's checks name
-- with_lock, not the lock call it makes.

local getinfo, getmetatable, next = debug.getinfo, getmetatable, next
local floor = math.floor
local THIS_FILE = getinfo(1, "S").source
local MAX_MS = 2147483647  -- what fits the core's int milliseconds

-- Raise msg at the first caller outside this file. A pcall of ours (a C
-- frame between two of ours, as the one that guards a watch) is passed
-- over; a caller's pcall is that first caller, as for any Lua function.
local function raise(msg)
    local level = 2
    while true do
        local info = getinfo(level, "S")
        if info == nil then level = 0; break end -- no caller outside: no position
        if info.source ~= THIS_FILE then
            local above = info.what == "C" and getinfo(level + 1, "S")
            if not (above and above.source == THIS_FILE) then break end
        end
        level = level + 1
    end
    error(msg, level)
end

local function argerror(pos, fname, msg)
    raise(("bad argument #%d to '%s' (%s)"):format(pos, fname, msg))
end

-- A value as a message shows it: numbers as they are, strings quoted with
-- their type, anything else by its type.
local function show(v)
    local t = type(v)
    if t == "number" then return tostring(v) end
    if t == "string" then
        if #v > 40 then v = v:sub(1, 40) .. "..." end
        return (("string %q"):format(v):gsub("\\\n", "\\n"))
    end
    if t == "boolean" then return "boolean " .. tostring(v) end
    return t
end

local function is_int(v, lo, hi)
    return type(v) == "number" and v >= lo and v <= hi and v % 1 == 0
end

local function check_self(v, mt, fname, what, how)
    if getmetatable(v) ~= mt then
        argerror(1, fname, ("%s expected, got %s; call it as %s"):format(what, show(v), how))
    end
end

-- Why the key of resource (prefix .. resource) is one of ours and may not
-- be locked (redlock.h, rl_reserved_key: it starts with "redlock:" or ends
-- with ":fence"), or nil.
local function reserved(self, resource)
    local prefix = self.prefix or ""
    local why = C.rl_reserved_key(prefix, #prefix, resource, #resource)
    return why ~= nil and ffi_string(why) or nil
end

local function check_resource(self, pos, fname, resource, name)
    if type(resource) ~= "string" or #resource == 0 then
        argerror(pos, fname, ("%s must be a non-empty string, got %s")
            :format(name or "resource", resource == "" and "an empty string" or show(resource)))
    end
    local why = reserved(self, resource)
    if why then argerror(pos, fname, ("%s %s is reserved: %s"):format(name or "resource", show(resource), why)) end
end

local function check_ms(pos, fname, name, v)
    if not is_int(v, 1, MAX_MS) then
        argerror(pos, fname, ("%s must be a whole number of ms from 1 to %d, got %s"):format(name, MAX_MS, show(v)))
    end
end

-- opts must be nil or a table whose keys are all in `known`.
local function check_opts(pos, fname, opts, known)
    if opts == nil then return nil end
    if type(opts) ~= "table" then
        argerror(pos, fname, "options must be a table or nil, got " .. show(opts))
    end
    for k in next, opts do
        if not known[k] then
            argerror(pos, fname, ("unknown option %s")
                :format(type(k) == "string" and ("'" .. k .. "'") or ("[" .. show(k) .. "]")))
        end
    end
    return opts
end

local NEW_KEYS = { servers = true, ttl = true, node_timeout = true, connect_timeout = true, quorum = true,
                   drift_factor = true, prefix = true, retry = true, max_extensions = true, keepalive = true,
                   notify = true, tls = true }
local TLS_KEYS = { cafile = true, capath = true, certfile = true, keyfile = true, server_name = true, verify = true }
local TLS_STRINGS = { "cafile", "capath", "certfile", "keyfile", "server_name" }
local LOCK_KEYS = { ttl = true, wait = true, retry = true, keepalive = true, margin = true, fence = true }

-- The option names the checks above accept, sorted: new()'s, its tls table's
-- and the lock calls'. Read by spec/docs_spec.lua, which checks that
-- docs/lua-api.md names each one.
local function sorted_names(set)
    local list = {}
    for k in pairs(set) do list[#list + 1] = k end
    table.sort(list)
    return list
end
_M._OPTIONS = { new = sorted_names(NEW_KEYS), tls = sorted_names(TLS_KEYS), lock = sorted_names(LOCK_KEYS) }

---------------------------------------------------------------------------
-- results

local function detail_of(self, r)
    local d = { ok = r.ok, quorum = r.quorum, elapsed = r.elapsed_ms, status = STATUS_WORDS[r.status] }
    for i = 0, r.nodes - 1 do
        local n = r.node[i]
        d[i + 1] = {
            server = self.names[i + 1],
            state = NODE_WORDS[n.state],
            error = n.errstr[0] ~= 0 and ffi_string(n.errstr) or nil,
        }
    end
    return d
end

local function failure(self, r)
    return nil, STATUS_WORDS[r.status] or "invalid", detail_of(self, r)
end

-- nil, word, detail for a call refused before anything was sent (invalid,
-- expired): the detail has the shape of a round's, no node asked, and says
-- why in detail.message.
local function refusal(self, word, message)
    local d = { ok = 0, quorum = self.quorum, elapsed = 0, status = word, message = message }
    for i = 1, #self.names do d[i] = { server = self.names[i], state = "pending" } end
    return nil, word, d
end

---------------------------------------------------------------------------
-- the client

local function options_struct(fname, o, nservers)
    local opts = ffi_new("rl_options")
    C.rl_options_init(opts)
    if o.node_timeout ~= nil then check_ms(1, fname, "node_timeout", o.node_timeout); opts.node_timeout_ms = o.node_timeout end
    if o.connect_timeout ~= nil then
        check_ms(1, fname, "connect_timeout", o.connect_timeout); opts.connect_timeout_ms = o.connect_timeout
    end
    if o.quorum ~= nil and nservers ~= nil then
        local majority = floor(nservers / 2) + 1
        if not is_int(o.quorum, majority, nservers) then
            argerror(1, fname, ("quorum must be a whole number from %d (a majority of %d) to %d, got %s")
                :format(majority, nservers, nservers, show(o.quorum)))
        end
        opts.quorum = o.quorum
    end
    if o.drift_factor ~= nil then
        local d = o.drift_factor
        if type(d) ~= "number" or not (d >= 0 and d < 1) then
            argerror(1, fname, "drift_factor must be a number in [0, 1), got " .. show(d))
        end
        opts.drift_factor = d
    end
    if o.prefix ~= nil then
        if type(o.prefix) ~= "string" then argerror(1, fname, "prefix must be a string, got " .. show(o.prefix)) end
        opts.prefix, opts.prefix_len = o.prefix, #o.prefix
    end
    local tls = o.tls
    if tls ~= nil then
        if type(tls) ~= "table" then argerror(1, fname, "tls must be a table, got " .. show(tls)) end
        for k in next, tls do
            if not TLS_KEYS[k] then
                argerror(1, fname, ("unknown option %s")
                    :format(type(k) == "string" and ("'tls." .. k .. "'") or ("tls[" .. show(k) .. "]")))
            end
        end
        for _, k in ipairs(TLS_STRINGS) do
            local v = tls[k]
            if v ~= nil then
                if type(v) ~= "string" or v == "" or v:find("\0", 1, true) then
                    argerror(1, fname, ("tls.%s must be a non-empty string, got %s"):format(k, show(v)))
                end
                opts.tls[k] = v -- points into v: the client keeps v (see new)
            end
        end
        if tls.verify ~= nil then
            if type(tls.verify) ~= "boolean" then argerror(1, fname, "tls.verify must be a boolean, got " .. show(tls.verify)) end
            opts.tls.verify = tls.verify and 1 or 0
        end
        if tls.keyfile ~= nil and tls.certfile == nil then
            argerror(1, fname, "tls.keyfile needs tls.certfile")
        end
    end
    return opts
end

-- The string fields of t, copied (the caller may change t later).
local function copy_strings(t)
    local c = {}
    for _, k in ipairs(TLS_STRINGS) do c[k] = t[k] end
    return c
end

local function server_list(fname, servers)
    if type(servers) ~= "table" or #servers == 0 then
        argerror(1, fname, "servers must be a non-empty list of URLs, got " .. show(servers))
    end
    local urls = ffi_new("const char *[?]", #servers)
    for i = 1, #servers do
        if type(servers[i]) ~= "string" then
            argerror(1, fname, ("servers[%d] must be a URL string, got %s"):format(i, show(servers[i])))
        end
        -- the core reads a C string: a NUL would cut the URL short unseen
        if servers[i]:find("\0", 1, true) then argerror(1, fname, ("servers[%d] holds a NUL byte"):format(i)) end
        urls[i - 1] = servers[i]
    end
    return urls
end

-- Check every option of new() (or configure(): nservers nil while the
-- servers are not known yet) but the server list; the options struct and the
-- ttl.
local function client_options(fname, opts, nservers)
    check_opts(1, fname, opts, NEW_KEYS)
    local copts = options_struct(fname, opts, nservers)
    local ttl = opts.ttl or 10000
    check_ms(1, fname, "ttl", ttl)
    if opts.retry ~= nil and type(opts.retry) ~= "function" then
        argerror(1, fname, "retry must be a function, got " .. show(opts.retry))
    end
    if opts.max_extensions ~= nil and not is_int(opts.max_extensions, 0, MAX_MS) then
        argerror(1, fname, ("max_extensions must be a whole number from 0 to %d, got %s")
            :format(MAX_MS, show(opts.max_extensions)))
    end
    if opts.keepalive ~= nil and type(opts.keepalive) ~= "boolean" then
        argerror(1, fname, "keepalive must be a boolean, got " .. show(opts.keepalive))
    end
    if opts.notify ~= nil and type(opts.notify) ~= "boolean" then
        argerror(1, fname, "notify must be a boolean, got " .. show(opts.notify))
    end
    return copts, ttl
end

--- Create a client. See docs/lua-api.md for the options; misuse raises.
function _M.new(opts)
    if opts == _M then argerror(1, "new", "options table expected, got the module (call redlock.new{...} with a dot)") end
    if type(opts) ~= "table" then argerror(1, "new", "options table expected, got " .. show(opts)) end
    local urls = server_list("new", opts.servers)
    local copts, ttl = client_options("new", opts, #opts.servers)
    local servers = {}
    for i = 1, #opts.servers do servers[i] = opts.servers[i] end

    local client = backend.client_new(urls, #servers, copts, errbuf, C.RL_ERR_LEN)
    if client == nil then argerror(1, "new", ffi_string(errbuf)) end

    local names = {}
    for i = 1, #servers do names[i] = ffi_string(client:node_name(i - 1)) end
    return setmetatable({
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
        tls = opts.tls and copy_strings(opts.tls), -- options.tls's strings point into these
        urls = urls,
        live = setmetatable({}, WEAK_KEYS), -- locks made here (released or not), for close()
        held = {},            -- value -> resource of each lock not unlocked nor kept, for close(),
        held_until = {},      -- value -> when its key is gone from every node by itself,
        held_n = 0,           -- so that close() releases locks whose objects were collected
        held_prune_at = HELD_PRUNE_MIN,
        head_starts = {},     -- resource -> until when a waiter that heard our release goes first
        head_start_n = 0,     -- entries in head_starts
        keeper = nil,         -- started on first use of keep-alive
        keeper_live = {},     -- .on while the keeper lives: what kept locks' finalizers check
    }, dlm_mt)
end

--- Remember options for redlock.default() (the host sets them from its flags).
function _M.configure(opts)
    if type(opts) ~= "table" then argerror(1, "configure", "options table expected, got " .. show(opts)) end
    -- checked now, where the mistake is, rather than by default() later
    if opts.servers ~= nil then server_list("configure", opts.servers) end
    client_options("configure", opts, opts.servers and #opts.servers)
    defaults = opts
end

local function servers_from_env()
    local env = os.getenv("REDLOCK_SERVERS")
    if not env or env == "" then return nil end
    local list = {}
    for url in env:gmatch("[^,%s]+") do list[#list + 1] = url end
    return list
end

--- TLS settings from REDLOCK_CACERT, REDLOCK_CACERTDIR, REDLOCK_CERT,
-- REDLOCK_KEY and REDLOCK_SNI (the host's flags go over them; turning
-- verification off is the host's --insecure only), or nil when none is set.
local TLS_ENV = { cafile = "REDLOCK_CACERT", capath = "REDLOCK_CACERTDIR", certfile = "REDLOCK_CERT",
                  keyfile = "REDLOCK_KEY", server_name = "REDLOCK_SNI" }
function _M.tls_from_env()
    local t
    for k, name in pairs(TLS_ENV) do
        local v = os.getenv(name)
        if v and v ~= "" then t = t or {}; t[k] = v end
    end
    return t
end

--- A client built from redlock.configure{...} or REDLOCK_SERVERS (and the
-- REDLOCK_* TLS variables), made once.
function _M.default()
    if _M._default then return _M._default end
    local opts = {}
    for k, v in pairs(defaults) do opts[k] = v end
    if not opts.servers then opts.tls = opts.tls or _M.tls_from_env() end
    opts.servers = opts.servers or servers_from_env()
    if not opts.servers then
        error("no servers configured: pass --servers URL,URL,... or set REDLOCK_SERVERS "
            .. "(`redlock dev` starts a throwaway local cluster and prints the line to use)", 2)
    end
    _M._default = _M.new(opts)
    return _M._default
end

--- The node names (URLs without passwords), in server order.
function dlm:nodes()
    check_self(self, dlm_mt, "nodes", "a client", "dlm:nodes()")
    local list = {}
    for i = 1, #self.names do list[i] = self.names[i] end
    return list
end

local function live_client(self, fname)
    local client = self.client
    if client == nil then raise(("'%s' on a closed client"):format(fname)) end
    return client
end

-- Raise if the transport can do no I/O here (inside nginx, a phase without
-- cosockets), before a call changes any state.
local function check_phase()
    local why = backend.phase_refusal and backend.phase_refusal()
    if why then raise("redlock: " .. why) end
end

-- A kept lock that is garbage-collected without unlock() must not stay
-- extended for the life of the process: its guard (a small cdata holding the
-- keeper's id for it) has the client's drop_guard as finalizer, which hands
-- the lock back to the keeper to release. One finalizer per client, not a
-- closure per lock: 10,000 kept locks cost 10,000 small cdata and nothing else.
-- The finalizer holds the keeper (so GC keeps the keeper until every guard is
-- done), never a lock (so locks can be collected), and checks `live`: close(),
-- and the keeper's own finalizer when lua_close runs every finalizer in no
-- particular order, clear it first.
local function drop_guard_for(k, live)
    return function(g)
        if live.on then k:drop(g.id) end
    end
end

-- The client's keeper, started on first use; or nil, why.
local function keeper_of(self)
    local k = self.keeper
    if k == nil then
        -- Collected (or closed with the Lua state, as on an uncaught error
        -- or os.exit(code, true)) with locks still kept, a keeper releases
        -- them in bounded time instead of leaving them for their ttl.
        k = backend.keeper_new(self, errbuf, RELEASE_BOUND_MS)
        if k == nil then return nil, "cannot start keep-alive: " .. ffi_string(errbuf) end
        local live = self.keeper_live
        live.on = true
        self.keeper = k
        self.drop_guard = drop_guard_for(k, live)
    end
    return k
end

---------------------------------------------------------------------------
-- locks

-- A lock not kept and not unlocked is listed in the client's `held` until
-- its key has left every node by itself: started + ttl, stretched by the
-- drift allowance. close() releases what is listed, whether or not the lock
-- object is still alive (a dropped lock is not released at collection: it
-- runs out its ttl unless close() or unlock() runs first).
local function hold_until(lk, started, ttl)
    local d = lk.dlm
    local until_ = started + ttl * (1 + d.options.drift_factor) + 2
    local v = lk.value
    local old = d.held_until[v]
    if old == nil then
        d.held[v] = lk.resource
        d.held_n = d.held_n + 1
    elseif old > until_ then
        return
    end
    d.held_until[v] = until_
end

local function unhold(d, v)
    if d.held[v] ~= nil then
        d.held[v], d.held_until[v] = nil, nil
        d.held_n = d.held_n - 1
    end
end

-- A lock whose release has gone out: close() has nothing more to do for it.
local function forget(lk)
    unhold(lk.dlm, lk.value)
    lk.dlm.live[lk] = nil
end

-- The longest a call waits for room in a full client (RL_ERR_FULL: every
-- operation slot taken, nothing sent): as long as the tails of earlier
-- operations may take to end (a node timeout, a connect).
local function room_deadline(d)
    return C.rl_now_ms() + d.options.node_timeout_ms + d.options.connect_timeout_ms
end

-- A blocking form op(client, ...) returned rc, not RL_OK: while that is
-- RL_ERR_FULL, let earlier tails end and call op again, within
-- room_deadline; any other failure raises.
local function again_when_full(d, client, rc, op, ...)
    local deadline = room_deadline(d)
    while rc == RL_ERR_FULL and C.rl_now_ms() < deadline do
        client:sleep(1)
        rc = op(client, ...)
    end
    if rc ~= RL_OK then raise("redlock: " .. ffi_string(client:errstr())) end
end

local function ignore() end

-- n operations in flight together: begin(i) starts the i-th (its id; a
-- negative number when it cannot start; nil when there is nothing to
-- start), done(i, got) takes its result from `result` (got false: none
-- came, the reason is client:errstr()). While the client is full, the
-- operations begun so far are taken to make room, else earlier tails are
-- let end, all within one room_deadline. stop(), if given, says when to
-- begin no more; a begin that fails then ends the beginning too. Returns
-- nil, or why the first operation that could not start failed.
local function batch(d, client, n, begin, done, stop)
    local ids, begun, taken, deadline, why = {}, 0, 0, nil, nil
    local function take()
        for i = taken + 1, begun do
            if ids[i] then done(i, client:wait(ids[i], result) == RL_OK) end
        end
        taken = begun
    end
    for i = 1, n do
        if stop and (why or stop()) then break end
        local id = begin(i)
        while id == RL_ERR_FULL do
            if taken < begun then
                take()
            else
                deadline = deadline or room_deadline(d)
                if C.rl_now_ms() >= deadline then break end
                client:sleep(1)
            end
            id = begin(i)
        end
        if id and id < 0 then why = why or ffi_string(client:errstr()) end
        ids[i] = id and id >= 0 and id
        begun = i
    end
    take()
    return why
end

-- Drop the listed locks whose keys are gone by themselves; then wait for
-- the list to double before looking again.
local function prune_held(d)
    local now, n = C.rl_now_ms(), 0
    for v, until_ in pairs(d.held_until) do
        if until_ <= now then d.held[v], d.held_until[v] = nil, nil else n = n + 1 end
    end
    d.held_n = n
    d.held_prune_at = n * 2 > HELD_PRUNE_MIN and n * 2 or HELD_PRUNE_MIN
end

-- A fenced lock's token as an int64_t cdata of its own (exact up to 2^63-1,
-- where a Lua number stops at 2^53; made int64_t, not the struct field's
-- long long, so that string.format's %d takes it too), and its decimal
-- text; nil, nil for an unfenced lock.
local function token_of(r)
    if r.token == 0 then return nil, nil end
    local t = int64_t(r.token)
    return t, ("%d"):format(t)
end

local function new_lock(self, resource, ttl, started, r)
    local token, token_string = token_of(r)
    local lk = setmetatable({
        dlm = self,
        resource = resource,
        value = ffi_string(r.value, VALUE_LEN),
        ttl = ttl,
        validity = floor(r.validity_ms), -- whole ms: a fraction less, never more
        votes = r.ok,         -- nodes that had granted it when quorum was reached
        token = token,        -- a fenced lock's fencing token (int64_t cdata), else nil
        token_string = token_string, -- the same in decimal (for JSON, headers, the environment)
        valid_until = started + floor(r.validity_ms),
        extensions = 0,
        released = false,
        kept = nil,
    }, lock_mt)
    self.live[lk] = true
    hold_until(lk, started, ttl)
    if self.held_n >= self.held_prune_at then prune_held(self) end
    return lk
end

-- Hand a held lock to the keeper. Returns true, or nil, why.
local function keep(lk, margin)
    local self = lk.dlm
    local k, why = keeper_of(self)
    if not k then return nil, why end
    local id = k:add(lk.resource, #lk.resource, lk.value, lk.ttl,
                               lk.valid_until, margin or 0, errbuf, C.RL_ERR_LEN)
    if id < 0 then return nil, "keep-alive refused the lock: " .. ffi_string(errbuf) end
    lk.kept, lk.margin = id, margin or 0
    lk.guard = ffi_gc(guard_t(id), self.drop_guard)
    unhold(self, lk.value) -- the keeper releases it, if its object is collected too
    return true
end

-- Keep every lock of a list, or release them all and raise at the caller of
-- the caller: a lock the caller never sees must not stay behind.
local function keep_or_release(locks, margin)
    for i = 1, #locks do
        local ok, why = keep(locks[i], margin)
        if not ok then
            for j = 1, #locks do
                if not locks[j].released then locks[j]:unlock() end
            end
            raise("redlock: " .. why)
        end
    end
end

-- One attempt with the client's acquire (plain, fenced or queued). Returns a lock,
-- or nil, err, detail.
local function attempt_by(self, client, resource, ttl, acquire)
    local started = C.rl_now_ms()
    local rc = acquire(client, resource, #resource, ttl, result)
    if rc ~= RL_OK then again_when_full(self, client, rc, acquire, resource, #resource, ttl, result) end
    if result.status == OK then return new_lock(self, resource, ttl, started, result) end
    return failure(self, result)
end

local function attempt(self, client, resource, ttl)
    return attempt_by(self, client, resource, ttl, client.acquire)
end

-- A fenced lock: the same, with its token committed.
local function attempt_fenced(self, client, resource, ttl)
    return attempt_by(self, client, resource, ttl, client.acquire_fenced)
end

-- A waiter's attempt: the same, and refused, the client joins the nodes'
-- queues of waiters, so that a release wakes it alone (redlock.h, "Hand-off").
local function attempt_queued(self, client, resource, ttl)
    return attempt_by(self, client, resource, ttl, client.acquire_queued)
end


-- Check every option of a lock call before anything is sent; returns what
-- the call needs.
local function lock_options(self, fname, resource, opts)
    check_resource(self, 1, fname, resource)
    opts = check_opts(2, fname, opts, LOCK_KEYS)
    local ttl, wait, policy, keepalive, margin, fence = self.ttl, nil, self.retry, self.keepalive, nil, false
    if opts then
        if opts.ttl ~= nil then check_ms(2, fname, "ttl", opts.ttl); ttl = opts.ttl end
        if opts.wait ~= nil then
            local w = opts.wait
            if type(w) ~= "number" or not (w >= 0 and w <= MAX_MS) then
                argerror(2, fname, ("wait must be a number of ms from 0 to %d, got %s"):format(MAX_MS, show(w)))
            end
            wait = w
            if opts.retry == nil then policy = RETRY_UNTIL_WAIT end
        end
        if opts.retry ~= nil then
            if type(opts.retry) ~= "function" then argerror(2, fname, "retry must be a function, got " .. show(opts.retry)) end
            policy = opts.retry
        end
        if opts.keepalive ~= nil then
            if type(opts.keepalive) ~= "boolean" then
                argerror(2, fname, "keepalive must be a boolean, got " .. show(opts.keepalive))
            end
            keepalive = opts.keepalive
        end
        if opts.margin ~= nil then
            if not is_int(opts.margin, 0, ttl - 1) then
                argerror(2, fname, ("margin must be a whole number of ms from 0 to ttl - 1 (%d), got %s")
                    :format(ttl - 1, show(opts.margin)))
            end
            margin = opts.margin
        end
        if opts.fence ~= nil then
            if type(opts.fence) ~= "boolean" then argerror(2, fname, "fence must be a boolean, got " .. show(opts.fence)) end
            fence = opts.fence
        end
    end
    return ttl, wait, policy, keepalive, margin, fence
end

-- Hand-off: what a waiter listens to is its resource (a string), or for
-- lock_many every resource of the list, counted together (rl_heard(NULL)).
local function watch(client, a)
    if type(a) == "string" then
        client:watch(a, #a)
    else
        for i = 1, #a do client:watch(a[i], #a[i]) end
    end
end

local function unwatch(client, a)
    if type(a) == "string" then
        client:unwatch(a, #a)
    else
        for i = 1, #a do client:unwatch(a[i], #a[i]) end
    end
end

local function heard(client, a)
    if type(a) == "string" then return client:heard(a, #a) end
    return client:heard(nil, 0)
end

-- A host's hooks around the sleeps between attempts (_M._guard_acquisitions):
-- asleep() before, awake() after. Nothing is in flight for the call then,
-- so a host may end the process meanwhile. nil outside a host.
local around_sleeps

-- The sleeps between attempts: ms, or (until) up to ms or until a release of
-- a is heard since seen (1 then, else 0).
local function nap(client, ms)
    local h = around_sleeps
    if h then h[1]() end
    client:sleep(ms)
    if h then h[2]() end
end

local function sleep_until(client, a, seen, ms)
    local h = around_sleeps
    if h then h[1]() end
    local woke
    if type(a) == "string" then woke = client:sleep_until(a, #a, seen, ms) else woke = client:sleep_until(nil, 0, seen, ms) end
    if h then h[2]() end
    return woke
end

-- The delay a policy returned after attempt n, as whole ms; nil to give up.
-- A policy is the caller's code: what it raises passes through, and a delay
-- that is not a number of ms the core can sleep is misuse, raised at the
-- caller of lock.
local function policy_delay(policy, n, err, detail)
    local delay = policy(n, err, detail)
    if not delay then return nil end
    if type(delay) == "number" and delay >= 0 and delay <= MAX_MS then return floor(delay) end
    raise(("bad retry policy: after attempt %d it returned %s (expected nil or a number of ms from 0 to %d)")
        :format(n, show(delay), MAX_MS))
end

-- After a wake-up, a uniform whole delay of 0 to span-1 ms, span = the
-- waiters that listened for the release (its message says), at most this:
-- waiters woken by one release spread out instead of splitting the votes
-- among them, and a lone waiter goes at once. In the harness's hand-off
-- workload (8 waiters, 1 ms holds) 0-1 ms gave 320/s with a p50 of 1.2 ms,
-- none 230/s and 1.8 ms, 0-3 ms 400/s and 0.87 ms, 0-5 ms 380/s and 1.0 ms.
local WAKE_JITTER_MS = 4

local function wake_jitter(client, a)
    local span = type(a) == "string" and client:listeners(a, #a) or client:listeners(nil, 0)
    if span == 0 or span > WAKE_JITTER_MS then span = WAKE_JITTER_MS end
    local ms = floor(C.rl_random() * span)
    if ms > 0 then nap(client, ms) end
end

-- A releaser that locks the same resource again at once would nearly always
-- beat the waiter its release woke: that waiter first sleeps its 0-3 ms, then
-- needs a round. A release that a waiter heard (the script answers 2, counted
-- in rl_result.heard) therefore marks its resource, and a lock of it by the
-- same client within this many ms first waits out the rest (a release heard
-- meanwhile ends the wait, as for any waiter). Two processes that lock again
-- as soon as they unlock: 16% of the releases went to the other one without
-- it, ~100% with it. Without waiters a release is not marked, and costs nothing.
local HEAD_START_MS = 2 * WAKE_JITTER_MS

local function mark_head_start(self, resource)
    local marks, now = self.head_starts, C.rl_now_ms()
    if self.head_start_n >= 64 then -- forget the marks that ran out (resources not locked again)
        local n = 0
        for r, until_ms in pairs(marks) do
            if until_ms <= now then marks[r] = nil else n = n + 1 end
        end
        self.head_start_n = n
    end
    if marks[resource] == nil then self.head_start_n = self.head_start_n + 1 end
    marks[resource] = now + HEAD_START_MS
end

-- The latest head start that a (list of) resource(s) still owes; its marks go.
local function head_start_owed(self, a)
    if self.head_start_n == 0 then return 0 end
    local marks, until_ms = self.head_starts, 0
    for i = 1, type(a) == "string" and 1 or #a do
        local r = type(a) == "string" and a or a[i]
        local u = marks[r]
        if u then
            marks[r], self.head_start_n = nil, self.head_start_n - 1
            if u > until_ms then until_ms = u end
        end
    end
    return until_ms - C.rl_now_ms()
end

-- Attempts on wake-ups between two of the policy's attempts, at most: a
-- release heard after that, within the same delay, is left to the policy's
-- next attempt. Anyone who may publish on a node can send messages that
-- look like ours; this bounds what a flood of them costs (the policy's
-- attempts times 1 + this), while a waiter that keeps losing real hand-offs
-- still gets this many tries per delay.
local WAKE_ATTEMPTS = 4

-- Run `try` under the retry policy, within `wait` ms if given: the last attempt
-- starts no later than `wait` ms after the first (with_retries makes the
-- first, so the common path, success at once, never comes here). With notifications on, the
-- sleep between attempts ends early when a release of the resource is heard:
-- the count of releases heard is taken before each attempt (for the first,
-- when the watch begins, just after it), so one heard during an attempt
-- ends the next sleep at once; one missed costs a poll interval. Attempts
-- made on a wake-up are extra: the policy counts those made after its
-- delay, and WAKE_ATTEMPTS bounds them per delay.
-- owed: a head start still owed (ms), before the first attempt; else the
-- first attempt has been made, and err, detail say how it failed.
local function retries(self, client, policy, deadline, try, a, b, err, detail, owed)
    local n = 1
    local notify = self.notify
    local seen = notify and heard(client, a)
    local got
    if owed then
        if sleep_until(client, a, seen, math.ceil(owed)) == 1 then wake_jitter(client, a) end
        seen = heard(client, a)
    end
    -- a waiter of one plain lock joins the queue at once, rather than after
    -- the first delay
    local queued = notify and try == attempt
    if queued then try = attempt_queued end
    if queued or owed then
        got, err, detail = try(self, client, a, b)
        if got then return got end
    end
    while true do
        local delay = policy_delay(policy, n, err, detail)
        if not delay then return nil, err, detail end
        -- closed by the policy, or by another coroutine while it yielded?
        live_client(self, type(a) == "string" and "lock" or "lock_many")
        if deadline then
            local left = deadline - C.rl_now_ms()
            if left <= 0 then return nil, err, detail end
            if delay > left then delay = left end
        end
        if notify then
            -- a release heard within the delay earns an extra attempt that the
            -- policy does not count (a busy resource would otherwise use up
            -- its attempts in wake-ups), WAKE_ATTEMPTS of them at most; the
            -- policy's attempt comes when the delay has passed
            local wake_by, extra = C.rl_now_ms() + delay, 0
            while true do
                local woke = sleep_until(client, a, seen, delay) == 1
                if woke and extra == WAKE_ATTEMPTS then
                    -- this delay's wake-ups are used up: sleep out the rest
                    local left = floor(wake_by - C.rl_now_ms())
                    if left > 0 then nap(client, left) end
                    woke = false
                elseif woke then
                    wake_jitter(client, a)
                end
                seen = heard(client, a)
                delay = floor(wake_by - C.rl_now_ms())
                if not woke or delay <= 0 then break end
                extra = extra + 1
                -- (a failure here is superseded by the policy's attempt below)
                got = try(self, client, a, b)
                if got then return got end
            end
        else
            nap(client, delay)
        end
        n = n + 1
        got, err, detail = try(self, client, a, b)
        if got then return got end
    end
end

-- retries with notifications on: the resource watched throughout. Whatever
-- ends them (a result, the policy's error, misuse, an attempt that raises)
-- ends the watch, unless the client is closed by then.
local function watched_retries(self, client, policy, deadline, try, a, b, err, detail, owed)
    watch(client, a)
    local ok, got, why, detail_ = pcall(retries, self, client, policy, deadline, try, a, b, err, detail, owed)
    if self.client == client then unwatch(client, a) end
    if not ok then error(got, 0) end
    return got, why, detail_
end

-- The first attempt, then the retries. A head start owed (see above) is
-- waited out first; with notifications on, within the same watch as the
-- retries, so that a release heard ends it.
local function with_retries(self, client, policy, wait, try, a, b)
    local deadline = wait and C.rl_now_ms() + wait
    local owed = head_start_owed(self, a)
    if owed > 0 and self.notify then
        return watched_retries(self, client, policy, deadline, try, a, b, nil, nil, owed)
    end
    if owed > 0 then nap(client, math.ceil(owed)) end
    local got, err, detail = try(self, client, a, b)
    if got then return got end
    if not self.notify then return retries(self, client, policy, deadline, try, a, b, err, detail) end
    return watched_retries(self, client, policy, deadline, try, a, b, err, detail)
end

--- Acquire resource, retrying under the policy. Returns a lock or nil, err, detail.
function dlm:lock(resource, opts)
    check_self(self, dlm_mt, "lock", "a client", "dlm:lock(...)")
    local ttl, wait, policy, keepalive, margin, fence = lock_options(self, "lock", resource, opts)
    local client = live_client(self, "lock")
    local lk, err, detail = with_retries(self, client, policy, wait, fence and attempt_fenced or attempt, resource, ttl)
    if lk and keepalive then keep_or_release({ lk }, margin) end
    return lk, err, detail
end

--- One attempt to acquire resource.
function dlm:try_lock(resource, opts)
    check_self(self, dlm_mt, "try_lock", "a client", "dlm:try_lock(...)")
    local ttl, _, _, keepalive, margin, fence = lock_options(self, "try_lock", resource, opts)
    local lk, err, detail = (fence and attempt_fenced or attempt)(self, live_client(self, "try_lock"), resource, ttl)
    if lk and keepalive then keep_or_release({ lk }, margin) end
    return lk, err, detail
end

local function kept_state(lk)
    local k = lk.dlm.keeper
    if lk.kept == nil or k == nil then return nil end
    local state = k:state(lk.kept, until_buf)
    if state < 0 then return nil end -- no longer known to the keeper: the validity says
    if state > 0 then lk.valid_until = until_buf[0] end
    return state
end

--- Milliseconds of validity left (<= 0 once it has run out).
function lock:remaining()
    check_self(self, lock_mt, "remaining", "a lock", "lock:remaining()")
    if self.released then return 0 end
    kept_state(self)
    return self.valid_until - C.rl_now_ms()
end

--- True while the lock is held: not unlocked, not lost, validity left.
function lock:valid()
    check_self(self, lock_mt, "valid", "a lock", "lock:valid()")
    return not self.released and not self:lost() and self:remaining() > 0
end

--- True once the lock is known to be gone: keep-alive failed, or validity ran out.
function lock:lost()
    check_self(self, lock_mt, "lost", "a lock", "lock:lost()")
    if self.released then return false end
    local state = kept_state(self)
    if state ~= nil then return state == C.RL_KEEP_LOST end
    return self.valid_until - C.rl_now_ms() <= 0
end

--- Raise "lost: ..." if the lock has been lost; return the lock otherwise.
function lock:check()
    check_self(self, lock_mt, "check", "a lock", "lock:check()")
    if self:lost() then
        error("lost: the lock on '" .. self.resource .. "' is no longer held", 2)
    end
    return self
end

-- The keeper lets go of lk; the client lists it again until its key would
-- be gone by itself (the keeper's last extension was at most a ttl ago).
local function stop_keeping(lk)
    if lk.kept ~= nil then hold_until(lk, C.rl_now_ms(), lk.ttl) end
    if lk.kept ~= nil and lk.dlm.keeper ~= nil then lk.dlm.keeper:remove(lk.kept) end
    if lk.guard ~= nil then ffi_gc(lk.guard, nil) end
    lk.kept, lk.guard = nil, nil
end

-- After an extend that was sent and failed, the lock is held no longer
-- than both what it had and what the round may have left: nodes that took
-- the new ttl drop the key by started + the new ttl's validity, and "not
-- held" means our value is gone from too many nodes for a quorum.
local function after_failed_extend(lk, ttl, started, r)
    local until_
    if r.status == C.RL_STATUS_NOT_HELD then
        until_ = started
    else
        local elapsed = C.rl_now_ms() - started
        until_ = started + ttl - elapsed - (ttl * lk.dlm.options.drift_factor + 2)
    end
    kept_state(lk)  -- a kept lock: start from the keeper's latest validity
    if until_ < lk.valid_until then lk.valid_until = until_ end
    if lk.kept ~= nil and lk.dlm.keeper ~= nil then
        -- the keeper goes on with the ttl it had, counting the lower validity
        lk.dlm.keeper:update(lk.kept, lk.ttl, started, lk.valid_until)
    end
end

--- Release every lock still held through this client (kept or not), then
--- close every connection now instead of at garbage collection. Bounded in
--- time: the releases go out together and end within the node timeout (more
--- than a client can have in flight wait for room, within one node and
--- connect timeout more: see batch); the keeper gets RELEASE_BOUND_MS for what it still releases itself (dropped
--- locks). A lock() or lock_many() retrying on this client raises
--- "'lock' on a closed client" instead of trying again. Closing twice is fine.
function dlm:close()
    check_self(self, dlm_mt, "close", "a client", "dlm:close()")
    local client = self.client
    if client == nil then return end
    check_phase() -- before any lock is marked released
    self.client = nil -- first: whatever runs from here on sees the client closed
    for lk in pairs(self.live) do
        if not lk.released then
            stop_keeping(lk)
            lk.released, lk.closed = true, true
        end
    end
    -- every lock not unlocked, its object alive or not (kept ones whose
    -- objects were collected are the keeper's, below)
    -- a copy: making room may yield (inside nginx), and another coroutine's
    -- lock would then change the list under pairs()
    local values, resources, held_until, now = {}, {}, self.held_until, C.rl_now_ms()
    for value, resource in pairs(self.held) do
        if held_until[value] > now then values[#values + 1], resources[#values + 1] = value, resource end
    end
    batch(self, client, #values, function(i)
        return client:begin_release(resources[i], #resources[i], values[i])
    end, ignore)
    self.live, self.held, self.held_until, self.held_n = setmetatable({}, WEAK_KEYS), {}, {}, 0
    local k = self.keeper
    if k ~= nil then
        self.keeper_live.on = false
        self.keeper = nil
        k:release(RELEASE_BOUND_MS)
        k:free()
    end
    client:free()
end

--- Extend the lock to ttl ms (default: its ttl) from now. true, nil, detail
--- or nil, err, detail. Decided at quorum: a node that had not answered by
--- then is "pending" in detail (it is still extended if it holds our value).
function lock:extend(ttl)
    check_self(self, lock_mt, "extend", "a lock", "lock:extend(ttl)")
    if ttl == nil then ttl = self.ttl else check_ms(1, "extend", "ttl", ttl) end
    if self.kept ~= nil and ttl <= self.margin then
        argerror(1, "extend", ("ttl must be above the lock's keep-alive margin (%d ms), got %d"):format(self.margin, ttl))
    end
    if self.released then return refusal(self.dlm, "invalid", "the lock was unlocked") end
    local max = self.dlm.max_extensions
    if max and self.extensions >= max then
        return refusal(self.dlm, "invalid", ("extension limit (%d) reached"):format(max))
    end
    if self:remaining() <= 0 then return refusal(self.dlm, "expired", "no validity left to extend") end
    local client = live_client(self.dlm, "extend")
    local started = C.rl_now_ms()
    local rc = client:extend(self.resource, #self.resource, self.value, ttl, result)
    if rc ~= RL_OK then
        again_when_full(self.dlm, client, rc, client.extend, self.resource, #self.resource, self.value, ttl, result)
    end
    -- nodes that took it keep the key up to the new ttl from here
    if self.kept == nil then hold_until(self, started, ttl) end
    if result.status ~= OK then
        after_failed_extend(self, ttl, started, result)
        return failure(self.dlm, result)
    end
    self.extensions = self.extensions + 1
    self.ttl = ttl
    self.validity = floor(result.validity_ms)
    self.valid_until = started + self.validity
    if self.kept ~= nil and self.dlm.keeper ~= nil then
        -- the keeper goes on with this ttl, not the one it was handed
        self.dlm.keeper:update(self.kept, ttl, started, self.valid_until)
    end
    return true, nil, detail_of(self.dlm, result)
end

--- Release the lock on every node. true, nil, detail once a quorum deleted
--- our value, or nil, err, detail ("not held" when our value was no longer
--- on a quorum: it expired or was taken over). Decided at quorum: a node that
--- had not answered by then is "pending" in detail, and the client sends it
--- the rest (a late NOSCRIPT gets its EVAL) on its next calls, or close().
--- After a failure the lock may be unlocked again (say, once nodes are
--- back); once it succeeded, unlocking again returns nil, "invalid", detail.
function lock:unlock()
    check_self(self, lock_mt, "unlock", "a lock", "lock:unlock()")
    if self.released then
        return refusal(self.dlm, "invalid", self.closed and "the lock was released when its client was closed"
            or "the lock was already unlocked")
    end
    if self.kept ~= nil then check_phase() end -- before keep-alive lets go of it (release refuses anyway)
    stop_keeping(self)
    local client = live_client(self.dlm, "unlock")
    local rc = client:release(self.resource, #self.resource, self.value, result)
    if rc ~= RL_OK then
        again_when_full(self.dlm, client, rc, client.release, self.resource, #self.resource, self.value, result)
    end
    if result.status == OK then
        self.released = true
        forget(self)
        if result.heard > 0 then mark_head_start(self.dlm, self.resource) end
        return true, nil, detail_of(self.dlm, result)
    end
    return failure(self.dlm, result)
end

---------------------------------------------------------------------------
-- many locks at once

-- Release the locks of a batch that failed, all in flight together. One
-- that cannot even begin stays listed for close() (and its ttl). Quietly:
-- nobody is woken by a lock given back unused, neither the other waiters of
-- the resource nor this waiter itself, which would otherwise hear its own
-- releases and try again at once, over and over (redlock.h, "Hand-off").
local function release_all_started(self, client, locks)
    batch(self, client, #locks, function(i)
        local lk = locks[i]
        lk.released = true
        local id = client:begin_release_quiet(lk.resource, #lk.resource, lk.value)
        if id >= 0 then forget(lk) end
        return id
    end, ignore)
end

-- One all-or-nothing attempt: every acquire in flight together (begin:
-- the client's begin_acquire or begin_acquire_fenced). With every operation
-- slot taken, the acquires begun so far are collected to make room; after a
-- refusal the rest are not begun.
local function attempt_many_with(self, client, resources, ttl, begin)
    local started = C.rl_now_ms()
    local locks, err, detail, unknown = {}, nil, nil, nil
    local why = batch(self, client, #resources, function(i)
        return begin(client, resources[i], #resources[i], ttl)
    end, function(i, got)
        if not got then
            -- no result (inside nginx: the hub gave up): not a lock
            unknown = unknown or ffi_string(client:errstr())
            err = err or "unavailable"
        elseif result.status == OK then
            locks[#locks + 1] = new_lock(self, resources[i], ttl, started, result)
        elseif not err then
            local _
            _, err, detail = failure(self, result)
            detail.resource = resources[i]
        end
    end, function() return err ~= nil end)
    unknown = why or unknown
    if unknown then
        release_all_started(self, client, locks)
        raise("redlock: " .. unknown)
    end
    if err then
        release_all_started(self, client, locks)
        return nil, err, detail
    end
    return setmetatable(locks, group_mt)
end

local function attempt_many(self, client, resources, ttl)
    return attempt_many_with(self, client, resources, ttl, client.begin_acquire)
end

local function attempt_many_fenced(self, client, resources, ttl)
    return attempt_many_with(self, client, resources, ttl, client.begin_acquire_fenced)
end

--- Acquire every resource or none; all requests in flight together.
--- Returns a list of locks (with :unlock(), :extend(), :valid()) or nil, err, detail.
function dlm:lock_many(resources, opts)
    check_self(self, dlm_mt, "lock_many", "a client", "dlm:lock_many(...)")
    if type(resources) ~= "table" or #resources == 0 then
        argerror(1, "lock_many", "resources must be a non-empty list of strings, got " ..
            (type(resources) == "table" and "an empty table" or show(resources)))
    end
    if #resources > ID_SLOTS then
        argerror(1, "lock_many", ("resources may list at most %d names, got %d"):format(ID_SLOTS, #resources))
    end
    local seen = {}
    for i = 1, #resources do
        local r = resources[i]
        check_resource(self, 1, "lock_many", r, ("resources[%d]"):format(i))
        if seen[r] then argerror(1, "lock_many", ("resources[%d] repeats resources[%d]"):format(i, seen[r])) end
        seen[r] = i
    end
    local ttl, wait, policy, keepalive, margin, fence = lock_options(self, "lock_many", resources[1], opts)
    local client = live_client(self, "lock_many")
    local locks, err, detail = with_retries(self, client, policy, wait, fence and attempt_many_fenced or attempt_many,
                                            resources, ttl)
    if locks and keepalive then keep_or_release(locks, margin) end
    return locks, err, detail
end

--- Release every lock of the group that is not released yet; true, or nil,
--- err, detail of the first failure. As with one lock: a lock whose release
--- failed may be unlocked again, and a group already unlocked returns nil,
--- "invalid", detail.
function group:unlock()
    check_self(self, group_mt, "unlock", "a group of locks", "locks:unlock()")
    local dlm_ = self[1].dlm
    local any = false
    for i = 1, #self do
        if not self[i].released then any = true end
    end
    if not any then return refusal(dlm_, "invalid", "the locks were already unlocked") end
    check_phase() -- before keep-alive lets go of them
    local client = live_client(dlm_, "unlock")
    local ok, err, detail, missing = true, nil, nil, nil
    local refused = batch(dlm_, client, #self, function(i)
        local lk = self[i]
        stop_keeping(lk)
        if lk.released then return nil end
        return client:begin_release(lk.resource, #lk.resource, lk.value)
    end, function(i, got)
        if not got then
            missing = missing or ffi_string(client:errstr())
        elseif result.status == OK then
            self[i].released = true
            forget(self[i])
            if result.heard > 0 then mark_head_start(dlm_, self[i].resource) end
        elseif ok then
            ok, err, detail = failure(dlm_, result)
            detail.resource = self[i].resource
        end
    end) or missing
    if refused then raise("redlock: " .. refused) end
    return ok, err, detail
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

---------------------------------------------------------------------------
-- critical sections

local function pack(...)
    return { n = select("#", ...), ... }
end

--- Acquire resource, run fn(lock, ...), always release. Keep-alive is on
--- unless opts.keepalive == false. Returns fn's results, or nil, err, detail
--- when the lock was not acquired; an error in fn is raised again after release.
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
    local out = pack(pcall(fn, lk, ...))
    lk:unlock()
    if not out[1] then error(out[2], 0) end
    return unpack(out, 2, out.n)
end

--- For a host: why the client self may not lock resource (its key is one of ours), or nil.
function _M._reserved(self, resource)
    return reserved(self, resource)
end

--- For a host that must not end while a lock is being acquired (its
--- signal handling): begin(dlm) before and done() after every lock, try_lock
--- and lock_many, whatever ends them, and asleep() / awake() around their
--- sleeps between attempts, when nothing is in flight. Once per process.
function _M._guard_acquisitions(begin, done, asleep, awake)
    if around_sleeps then return end
    around_sleeps = { asleep, awake }
    local function finish(ok, ...)
        done()
        if not ok then error((...), 0) end
        return ...
    end
    for _, name in ipairs { "lock", "try_lock", "lock_many" } do
        local call = dlm[name]
        dlm[name] = function(self, ...)
            begin(self)
            return finish(pcall(call, self, ...))
        end
    end
end

return _M
