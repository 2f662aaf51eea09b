-- redlock.options: the options of redlock.new (and configure), of the lock
-- calls, and what the environment says (REDLOCK_SERVERS, the REDLOCK_* TLS
-- variables). Every option is checked before anything is connected or sent;
-- misuse raises at the caller (redlock.check).

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local retry = require "redlock.retry"
local check = require "redlock.check"
check.ours()

local ffi_new = ffi.new
local floor = math.floor
local type, next, ipairs, pairs = type, next, ipairs, pairs
local argerror, show, is_int, check_ms, check_opts = check.argerror, check.show, check.is_int, check.ms, check.opts
local check_resource, check_list, show_url = check.resource, check.list, check.show_url
local MAX_MS = check.MAX_MS

--- Raise at fname's caller unless v, the option called name, is a number
--- of replicas a vote may wait for.
local function check_replicas(fname, name, v)
    if not is_int(v, 0, C.RL_MAX_REPLICAS) then
        argerror(1, fname, ("%s must be a whole number from 0 to %d, got %s"):format(name, C.RL_MAX_REPLICAS, show(v)))
    end
end

local _M = {}

local NEW_KEYS = { servers = true, ttl = true, node_timeout = true, connect_timeout = true, quorum = true,
                   drift_factor = true, prefix = true, retry = true, max_extensions = true, keepalive = true,
                   notify = true, tls = true, label = true, stats = true, replicas = true }
local TLS_KEYS = { cafile = true, capath = true, certfile = true, keyfile = true, server_name = true, verify = true }
local TLS_STRINGS = { "cafile", "capath", "certfile", "keyfile", "server_name" }
local SNI_MAX = 255 -- the longest server name a TLS handshake can send (as core/src/tls.c checks)
local LOCK_KEYS = { ttl = true, wait = true, retry = true, keepalive = true, margin = true, fence = true,
                    shared = true, limit = true }
local MAX_LIMIT = C.RL_MAX_LIMIT
local ADOPT_KEYS = { ttl = true, keepalive = true, margin = true, slot = true } -- dlm:adopt's: no attempts, no new token
local RETRY_UNTIL_WAIT = retry.forever()  -- `wait` without `retry`: try until wait runs out
local RESERVED_PREFIX = "redlock:" -- where redlock keeps its own keys (RL_RESERVED_PREFIX, core/src/command.h)

-- The option names the checks above accept, sorted: new()'s, its tls table's
-- and the lock calls'. Exported as redlock._OPTIONS and read by
-- spec/docs_spec.lua, which checks that docs/lua-api.md names each one.
local function sorted_names(set)
    local list = {}
    for k in pairs(set) do list[#list + 1] = k end
    table.sort(list)
    return list
end
_M.NAMES = { new = sorted_names(NEW_KEYS), tls = sorted_names(TLS_KEYS), lock = sorted_names(LOCK_KEYS),
             adopt = sorted_names(ADOPT_KEYS) }

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
    elseif o.quorum ~= nil and not is_int(o.quorum, 1, C.RL_MAX_NODES) then
        -- the servers come later (configure without them): what any list would refuse
        argerror(1, fname, ("quorum must be a whole number from 1 to %d, got %s"):format(C.RL_MAX_NODES, show(o.quorum)))
    end
    if o.drift_factor ~= nil then
        local d = o.drift_factor
        if type(d) ~= "number" or not (d >= 0 and d < 1) then
            argerror(1, fname, "drift_factor must be a number in [0, 1), got " .. show(d))
        end
        opts.drift_factor = d
    end
    if o.prefix ~= nil then
        local p = o.prefix
        if type(p) ~= "string" then argerror(1, fname, "prefix must be a string, got " .. show(p)) end
        -- as the core refuses them, also for configure without servers
        if #p > C.RL_MAX_KEY_LEN then
            argerror(1, fname, ("prefix is %d bytes long, more than a key may be (%d)"):format(#p, C.RL_MAX_KEY_LEN))
        end
        if p:sub(1, #RESERVED_PREFIX) == RESERVED_PREFIX then
            argerror(1, fname, ("prefix starts with \"%s\", where redlock keeps its own keys"):format(RESERVED_PREFIX))
        end
        opts.prefix, opts.prefix_len = p, #p
    end
    if o.label ~= nil then
        local l = o.label
        if type(l) ~= "string" or #l < 1 or #l > C.RL_LABEL_MAX or l:find("[^\33-\126]") or l:find("/", 1, true) then
            argerror(1, fname, ("label must be 1 to %d printable characters without '/' or space, got %s")
                :format(C.RL_LABEL_MAX, show(l)))
        end
        opts.label = l -- points into l: the client keeps l (see redlock.new)
    end
    if o.replicas ~= nil then
        check_replicas(fname, "replicas", o.replicas)
        opts.replicas = o.replicas
    end
    if o.stats ~= nil then
        if type(o.stats) ~= "boolean" then argerror(1, fname, "stats must be a boolean, got " .. show(o.stats)) end
        opts.no_stats = o.stats and 0 or 1
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
                opts.tls[k] = v -- points into v: the client keeps v (see redlock.new)
            end
        end
        if tls.server_name ~= nil and #tls.server_name > SNI_MAX then
            argerror(1, fname, ("tls.server_name: longer than %d bytes"):format(SNI_MAX))
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

--- The string fields of a tls table, copied (the caller may change it later).
function _M.copy_tls_strings(t)
    local c = {}
    for _, k in ipairs(TLS_STRINGS) do c[k] = t[k] end
    return c
end

--- A cluster node as the core reads it: { cluster = { "redis://h:p", ... },
--- replicas = N } (seeds sharing one scheme and one user:password; replicas
--- optional) as "redis-cluster://user:password@h:p+h:p?replicas=N"
--- (rediss-cluster:// for TLS).
local function cluster_url(fname, i, entry)
    local seeds = entry.cluster
    if type(seeds) ~= "table" or #seeds == 0 then
        argerror(1, fname, ("servers[%d].cluster must be a non-empty list of seed URLs, got %s"):format(i, show(seeds)))
    end
    check_list(1, fname, ("servers[%d].cluster"):format(i), seeds)
    for k in pairs(entry) do
        if k ~= "cluster" and k ~= "replicas" then
            argerror(1, fname, ("servers[%d] has an unknown field %s"):format(i, show(k)))
        end
    end
    local replicas = entry.replicas
    if replicas ~= nil then check_replicas(fname, ("servers[%d].replicas"):format(i), replicas) end
    local scheme, auth, hosts
    for j = 1, #seeds do
        local where = ("servers[%d].cluster[%d]"):format(i, j)
        local s, rest
        if type(seeds[j]) == "string" then s, rest = seeds[j]:match("^(rediss?)://(.+)$") end
        if not s or seeds[j]:find("[%z%s+?]") then
            argerror(1, fname, ("%s must be a redis:// or rediss:// URL (no '+', '?' or space), got %s")
                :format(where, show_url(seeds[j])))
        end
        local a, h = rest:match("^(.*@)([^@]*)$")
        a, h = a or "", h or rest
        if h:find("/", 1, true) then argerror(1, fname, ("%s: a cluster has only database 0: no /db"):format(where)) end
        if scheme and (s ~= scheme or a ~= auth) then
            argerror(1, fname, ("%s: every seed of a cluster must share its scheme and password"):format(where))
        end
        scheme, auth = s, a
        hosts = hosts and (hosts .. "+" .. h) or h
    end
    return scheme .. "-cluster://" .. auth .. hosts .. (replicas and ("?replicas=" .. replicas) or "")
end

--- The server list as the core reads it (const char *[n]), and the URL
--- strings (a cluster node's made from its table).
local function server_list(fname, servers)
    if type(servers) ~= "table" or #servers == 0 then
        argerror(1, fname, "servers must be a non-empty list of URLs, got " .. show(servers))
    end
    check_list(1, fname, "servers", servers)
    local urls, texts = ffi_new("const char *[?]", #servers), {}
    for i = 1, #servers do
        local url = servers[i]
        if type(url) == "table" then url = cluster_url(fname, i, url) end
        if type(url) ~= "string" then
            argerror(1, fname, ("servers[%d] must be a URL string or { cluster = {...} }, got %s"):format(i, show(servers[i])))
        end
        -- the core reads a C string: a NUL would cut the URL short unseen
        if url:find("\0", 1, true) then argerror(1, fname, ("servers[%d] holds a NUL byte"):format(i)) end
        urls[i - 1], texts[i] = url, url
    end
    return urls, texts
end
_M.server_list = server_list

--- A retry option that is set: a policy, not the maker of one.
local function check_retry(pos, fname, policy)
    if type(policy) ~= "function" then argerror(pos, fname, "retry must be a function, got " .. show(policy)) end
    local maker = retry._makers[policy]
    if maker then
        argerror(pos, fname, ("retry must be a policy: redlock.retry.%s makes one, call it (redlock.retry.%s(...))")
            :format(maker, maker))
    end
end

--- Check every option of new() (or configure(): nservers nil while the
--- servers are not known yet) but the server list; the options struct and
--- the ttl.
local function client_options(fname, opts, nservers)
    check_opts(1, fname, opts, NEW_KEYS)
    local copts = options_struct(fname, opts, nservers)
    local ttl = opts.ttl or 10000
    check_ms(1, fname, "ttl", ttl)
    if opts.retry ~= nil then check_retry(1, fname, opts.retry) end
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
_M.client_options = client_options

--- Why the core would refuse a client of the servers (a list of URL
--- strings) with the options copts (an rl_options, or nil for the
--- defaults): a bad URL, a server named twice, more servers than a client
--- may have, ...; nil when it would not. Nothing is looked up or connected.
function _M.engine_refusal(servers, copts)
    local urls = ffi_new("const char *[?]", #servers)
    for i = 1, #servers do urls[i - 1] = servers[i] end
    local errbuf = ffi_new("char[?]", C.RL_ERR_LEN)
    local engine = C.rl_engine_new(urls, #servers, copts, errbuf, C.RL_ERR_LEN)
    if engine == nil then return ffi.string(errbuf) end
    C.rl_engine_free(engine)
    return nil
end

-- v, and the tables in it, copied.
local function copy(v)
    if type(v) ~= "table" then return v end
    local c = {}
    for k, x in pairs(v) do c[k] = copy(x) end
    return c
end

--- Check options as configure() takes them (servers optional), the servers
--- as the core reads them (engine_refusal), as new() would; returns a copy of opts,
--- which the caller's later changes do not reach.
function _M.check_client(fname, opts)
    local _, texts
    if opts.servers ~= nil then _, texts = server_list(fname, opts.servers) end
    local copts = client_options(fname, opts, texts and #texts)
    local why = texts and _M.engine_refusal(texts, copts)
    if why then argerror(1, fname, why) end
    return copy(opts)
end

--- REDLOCK_SERVERS as a list (URLs separated by commas or spaces), or nil.
function _M.servers_from_env()
    local env = os.getenv("REDLOCK_SERVERS")
    if not env or env == "" then return nil end
    local list = {}
    for url in env:gmatch("[^,%s]+") do list[#list + 1] = url end
    return list
end

--- TLS settings from REDLOCK_CACERT, REDLOCK_CACERTDIR, REDLOCK_CERT,
--- REDLOCK_KEY and REDLOCK_SNI (the host's flags go over them; turning
--- verification off is the host's --insecure only), or nil when none is set.
local TLS_ENV = { cafile = "REDLOCK_CACERT", capath = "REDLOCK_CACERTDIR", certfile = "REDLOCK_CERT",
                  keyfile = "REDLOCK_KEY", server_name = "REDLOCK_SNI" }
_M.TLS_ENV = TLS_ENV
function _M.tls_from_env()
    local t
    for k, name in pairs(TLS_ENV) do
        local v = os.getenv(name)
        if v and v ~= "" then t = t or {}; t[k] = v end
    end
    return t
end

--- The largest keep-alive margin a lock of ttl ms on client d can have:
--- more than 1 ms below the validity of a grant that took no time at all
--- (ttl less the drift allowance, ttl * drift_factor + 2 ms), or it would
--- be lost as it is granted; 0 if even that is no time. (A grant that
--- takes longer than its validity less the margin is lost as it is
--- granted all the same.)
local function max_margin(d, ttl)
    local m = math.ceil(ttl - ttl * tonumber(d.options.drift_factor) - 2) - 2
    return m > 0 and m or 0
end
_M.max_margin = max_margin

--- Check every option of a lock call before anything is sent (d: the
--- client, for its defaults and prefix); returns ttl, wait, policy,
--- keepalive, margin, fence, shared, limit (a semaphore's, or nil for a
--- lock). keys: the options fname takes (default: a lock call's), at
--- argument pos (default 2). A margin goes with keep-alive only (on by
--- default in with_lock).
local function lock_options(d, fname, resource, opts, keys, pos)
    pos = pos or 2
    check_resource(d, 1, fname, resource)
    opts = check_opts(pos, fname, opts, keys or LOCK_KEYS)
    local ttl, wait, policy, keepalive, margin, fence, shared, limit = d.ttl, nil, d.retry,
        fname == "with_lock" or d.keepalive, nil, false, false, nil
    if opts then
        if opts.ttl ~= nil then check_ms(pos, fname, "ttl", opts.ttl); ttl = opts.ttl end
        if opts.wait ~= nil then
            local w = opts.wait
            if type(w) ~= "number" or not (w >= 0 and w <= MAX_MS) then
                argerror(pos, fname, ("wait must be a number of ms from 0 to %d, got %s"):format(MAX_MS, show(w)))
            end
            wait = w
            if opts.retry == nil then policy = RETRY_UNTIL_WAIT end
        end
        if opts.retry ~= nil then
            check_retry(pos, fname, opts.retry)
            policy = opts.retry
        end
        if opts.keepalive ~= nil then
            if type(opts.keepalive) ~= "boolean" then
                argerror(pos, fname, "keepalive must be a boolean, got " .. show(opts.keepalive))
            end
            keepalive = opts.keepalive
        end
        if opts.margin ~= nil then
            if not keepalive then
                argerror(pos, fname, "margin needs keep-alive (keepalive = true): it says when keep-alive "
                    .. "calls the lock lost")
            end
            local most = max_margin(d, ttl)
            if not is_int(opts.margin, 0, most) then
                argerror(pos, fname, ("margin must be a whole number of ms from 0 to %d (below the validity of a "
                    .. "ttl of %d ms), got %s"):format(most, ttl, show(opts.margin)))
            end
            margin = opts.margin
        end
        if opts.fence ~= nil then
            if type(opts.fence) ~= "boolean" then argerror(pos, fname, "fence must be a boolean, got " .. show(opts.fence)) end
            fence = opts.fence
        end
        if opts.shared ~= nil then
            if type(opts.shared) ~= "boolean" then argerror(pos, fname, "shared must be a boolean, got " .. show(opts.shared)) end
            shared = opts.shared
        end
        if fence and shared then
            argerror(pos, fname, "fence and shared exclude each other: a shared hold has no fencing token")
        end
        if opts.limit ~= nil then
            if not is_int(opts.limit, 1, MAX_LIMIT) then
                argerror(pos, fname, ("limit must be a whole number from 1 to %d, got %s"):format(MAX_LIMIT, show(opts.limit)))
            end
            if fence then
                argerror(pos, fname, "fence cannot go with limit: a semaphore's slots carry no fencing token")
            end
            if shared then
                argerror(pos, fname, "shared cannot go with limit: a semaphore's slots are exclusive holds")
            end
            if fname == "lock_many" then
                argerror(pos, fname, "limit cannot go with lock_many: take a semaphore with lock, try_lock or with_lock")
            end
            -- the acquire names every slot's key (as the engine counts them)
            local keylen = #(d.prefix or "") + #resource
            if opts.limit * (keylen + 24) > C.RL_MAX_SLOT_KEYS then
                argerror(pos, fname, ("limit %d with a key of %d bytes would name %d bytes of slot keys in every "
                    .. "acquire (at most %d): take a smaller limit or a shorter resource")
                    :format(opts.limit, keylen, opts.limit * (keylen + 24), C.RL_MAX_SLOT_KEYS))
            end
            limit = opts.limit
        end
    end
    return ttl, wait, policy, keepalive, margin, fence, shared, limit
end
_M.lock_options = lock_options

-- A lock value as the core makes it: RL_VALUE_LEN characters, lowercase
-- hex after an optional holder label and '/' (1 to RL_LABEL_MAX printable
-- characters, no '/', no space), the last an 's' for a shared hold. (An
-- uppercase one, which the core never makes, could only be "not held".)
local function lock_value(v)
    if type(v) ~= "string" or #v ~= C.RL_VALUE_LEN then return false end
    local label, rest = v:match("^([^/]*)/(.*)$")
    if label and not (#label <= C.RL_LABEL_MAX and label:match("^[!-.0-~]+$")) then return false end
    return (rest or v):match("^[0-9a-f]+[0-9a-fs]$") ~= nil
end

--- dlm:adopt's arguments (options at position 3): ttl, keepalive, margin,
--- slot (a semaphore's slot that value holds, or nil).
function _M.adopt_options(d, fname, resource, value, opts)
    check_resource(d, 1, fname, resource)
    if not lock_value(value) then
        argerror(2, fname, ("value must be a lock value (%d characters: lowercase hex after an optional label and '/',"
            .. " the last an 's' for a shared hold), got %s"):format(C.RL_VALUE_LEN, show(value)))
    end
    local ttl, _, _, keepalive, margin = lock_options(d, fname, resource, opts, ADOPT_KEYS, 3)
    local slot = opts and opts.slot
    if slot ~= nil and not is_int(slot, 1, MAX_LIMIT) then
        argerror(3, fname, ("slot must be a whole number from 1 to %d, got %s"):format(MAX_LIMIT, show(slot)))
    end
    if slot ~= nil and value:sub(-1) == "s" then
        argerror(3, fname, "slot goes with a semaphore's value, not a shared hold's (a value ending in 's')")
    end
    return ttl, keepalive, margin, slot
end

return _M
