--- Where the servers come from (--servers, --servers-file, else
-- REDLOCK_SERVERS), the TLS settings (flags, else REDLOCK_* variables), and
-- the host's thin layer over the Lua API: one client per process, keep-alive on.

local host = require "redlock.host"

local _M = {}

_M.OPTIONS = {
    { name = "servers", long = "servers", arg = "URL,...",
        help = "the Redis nodes (default: $REDLOCK_SERVERS)" },
    { name = "servers_file", long = "servers-file", arg = "FILE",
        help = "read the nodes from FILE, one URL a line, # comments (keeps passwords out of argv)" },
    { name = "cacert", long = "cacert", arg = "FILE",
        help = "rediss://: verify nodes with the CAs in FILE (default: $REDLOCK_CACERT, else the system's)" },
    { name = "cacertdir", long = "cacertdir", arg = "DIR",
        help = "rediss://: ... and with the hashed CA certificates in DIR ($REDLOCK_CACERTDIR)" },
    { name = "cert", long = "cert", arg = "FILE",
        help = "rediss://: client certificate for mutual TLS ($REDLOCK_CERT)" },
    { name = "key", long = "key", arg = "FILE",
        help = "rediss://: its private key ($REDLOCK_KEY)" },
    { name = "sni", long = "sni", arg = "NAME",
        help = "rediss://: server name to send and verify instead of each URL's host ($REDLOCK_SNI)" },
    { name = "insecure", long = "insecure",
        help = "rediss://: do not verify the nodes' certificates ($REDLOCK_INSECURE=1)" },
    { name = "prefix", long = "prefix", arg = "PREFIX",
        help = "prepended to every resource name to form its key (default: $REDLOCK_PREFIX)" },
    { name = "label", long = "label", arg = "TEXT",
        help = "the holder's label in lock values, shown by `redlock status` (default: HOST:PID, 15 characters at most)" },
}

--- A command's option spec: its own options, then the server options and --help.
function _M.spec(own)
    local spec = {}
    for _, o in ipairs(own) do spec[#spec + 1] = o end
    for _, o in ipairs(_M.OPTIONS) do spec[#spec + 1] = o end
    spec[#spec + 1] = require("redlock.host.args").HELP
    return spec
end

local NO_SERVERS = "no servers configured: pass --servers URL,URL,... or set REDLOCK_SERVERS"
    .. " (`redlock dev` starts a throwaway local cluster and prints the line to use)"

--- Split "a, b,c" into a list.
function _M.split(text)
    local list = {}
    for url in text:gmatch("[^,%s]+") do list[#list + 1] = url end
    return list
end

--- The URLs in a servers file: one a line (commas too), blank lines and
-- # comments skipped. nil and a message (never the file's text) on error.
local function read_servers_file(path)
    local f, err = io.open(path, "rb")
    if not f then return nil, "--servers-file: cannot read " .. tostring(err) end
    local text, rerr = f:read("*a")
    f:close()
    if not text then
        return nil, ("--servers-file: cannot read %s: %s"):format(path, tostring(rerr))
    end
    -- a comment starts a line or follows white space: a '#' inside a URL
    -- (an unencoded password) stays, and the URL is refused as it is
    text = ("\n" .. text):gsub("(%s)#[^\n]*", "%1"):sub(2)
    if not text:find("[^,%s]") then return nil, "--servers-file " .. path .. " names no servers" end
    return text
end

--- The server list from opts.servers, opts.servers_file or REDLOCK_SERVERS;
-- nil and a message if none.
function _M.servers(opts)
    local text = opts.servers
    local from = "--servers"
    if text ~= nil and opts.servers_file ~= nil then
        return nil, "--servers and --servers-file: give one of them"
    end
    if text == nil and opts.servers_file ~= nil then
        local err
        text, err = read_servers_file(opts.servers_file)
        if not text then return nil, err end
        from = "--servers-file"
    end
    if text == nil then
        text = os.getenv("REDLOCK_SERVERS")
        from = "REDLOCK_SERVERS"
    end
    if text == nil or text:match("^[,%s]*$") then
        if text ~= nil then return nil, from .. " is empty; " .. NO_SERVERS end
        return nil, NO_SERVERS
    end
    return _M.split(text)
end

--- The servers' URLs as the core reads them, without looking anything up
-- or connecting: true, or nil and why (a bad URL, a server named twice, which
-- would vote twice).
function _M.check_servers(servers)
    local why = require("redlock.options").engine_refusal(servers, nil)
    if why then return nil, why end
    return true
end

--- What a command that starts before it locks (run, demo) checks of the
--- servers it was given: their URLs (check_servers), and the TLS files a
--- client reads when it is made (made once now, as exec and status make
--- theirs). true, or nil and why: a usage error either way.
function _M.check_usable(servers, opts)
    local ok, err = _M.check_servers(servers)
    if not ok then return nil, err end
    if _M.tls_options(opts) then
        local dlm, terr = _M.client(opts)
        if not dlm then return nil, terr end
        dlm:close()
    end
    return true
end

local function env(name)
    local v = os.getenv(name)
    if v == "" then return nil end
    return v
end

local FALSE_WORDS = { ["0"] = true, no = true, ["false"] = true, off = true }

-- REDLOCK_INSECURE=1 (or yes, true, ...): anything set but 0, no, false, off.
local function truthy(v)
    return v ~= nil and not FALSE_WORDS[v:lower():match("^%s*(.-)%s*$")]
end

local warned_insecure = false

--- Say nothing more about --insecure or REDLOCK_INSECURE: this process's
--- parent said it already (the demo, for its workers).
function _M.insecure_warned()
    warned_insecure = true
end

-- The flag that sets each tls option (the REDLOCK_* variable is the
-- fallback: redlock.tls_from_env).
local TLS_FLAGS = { cacert = "cafile", cacertdir = "capath", cert = "certfile", key = "keyfile", sni = "server_name" }

--- The tls option table from the flags, else the REDLOCK_* variables (nil
-- when nothing is set). --insecure warns on stderr, once.
function _M.tls_options(opts)
    local t = require("redlock").tls_from_env() or {}
    for flag, option in pairs(TLS_FLAGS) do
        if opts[flag] then t[option] = opts[flag] end
    end
    local insecure = opts.insecure or truthy(env("REDLOCK_INSECURE"))
    if insecure then
        t.verify = false
        if not warned_insecure then
            warned_insecure = true
            io.stderr:write("redlock: warning: TLS certificate verification is off (",
                opts.insecure and "--insecure" or "REDLOCK_INSECURE", "): anyone on the path can pose as a node\n")
        end
    end
    if next(t) == nil then return nil end
    return t
end

--- Whether the TLS settings of the command line and environment make a
--- TLS context, as a client's do when it is made (core/src/tls.c: the same
--- check, connecting nowhere): true, or nil and why, naming the flag or
--- variable that gave the file.
function _M.check_tls(opts)
    local ok, err = require("redlock.host.sys").check_tls(_M.tls_options(opts))
    if ok then return true end
    return nil, _M.flag_message(err, opts)
end

--- The label this process's lock values carry: --label, else HOST:PID (the
-- host name cut so that the whole fits the 15 characters a label may have).
function _M.label(opts)
    if opts.label then return opts.label end
    local sys = require "redlock.host.sys"
    local pid = tostring(sys.getpid())
    local name = sys.hostname():gsub("[^%w%-_.]", "")
    return name:sub(1, 14 - #pid) .. ":" .. pid
end

-- Keys under this prefix are redlock's own (RL_RESERVED_PREFIX in
-- core/src/command.h): a client refuses a prefix that starts with it.
local RESERVED_PREFIX = "redlock:"

--- --label, and the prefix from --prefix or REDLOCK_PREFIX, checked as a
--- client checks them: true, or nil and a message naming the flag or the
--- variable that set the one it refuses.
function _M.check_label_and_prefix(opts)
    local l = opts.label
    if l and (#l < 1 or #l > 15 or l:find("[^\33-\126]") or l:find("/", 1, true)) then
        return nil, "--label must be 1 to 15 printable characters without '/' or space"
    end
    local prefix, from = opts.prefix, "--prefix"
    if prefix == nil then prefix, from = os.getenv("REDLOCK_PREFIX"), "REDLOCK_PREFIX" end
    if prefix == nil then return true end
    local max_key = require("redlock.cdefs").lib.RL_MAX_KEY_LEN
    if #prefix > max_key then
        return nil, ("%s is %d bytes long, more than a key may be (%d)"):format(from, #prefix, max_key)
    end
    if prefix:sub(1, #RESERVED_PREFIX) == RESERVED_PREFIX then
        return nil, ("%s '%s' starts with \"%s\", where redlock keeps its own keys"):format(from,
            host.printable(prefix), RESERVED_PREFIX)
    end
    return true
end

--- Client options from the command line and environment (nil, err without
--- servers, or with a label or prefix a client refuses).
function _M.client_options(opts)
    local servers, err = _M.servers(opts)
    if not servers then return nil, err end
    local ok, lerr = _M.check_label_and_prefix(opts)
    if not ok then return nil, lerr end
    local prefix = opts.prefix or os.getenv("REDLOCK_PREFIX")
    return { servers = servers, prefix = prefix ~= "" and prefix or nil, keepalive = true,
        tls = _M.tls_options(opts), label = _M.label(opts) }
end

-- An error that is the user's configuration, not the script: `redlock run`
-- exits 64 with its message and no traceback.
local USAGE_MT = { __tostring = function(e) return e.msg end }

function _M.is_usage_error(e)
    return type(e) == "table" and getmetatable(e) == USAGE_MT
end

-- Signals while a lock is being acquired (see rl_host_acquire_begin in
-- core/host/host.h). Every lock, try_lock and lock_many of the host runs
-- between sys.acquire_begin and sys.acquire_end (the library's acquiring and
-- acquired hooks), so a SIGTERM then waits for the acquisition to be
-- over (the lock is the keeper's, which releases it, or the library released
-- what it got) instead of leaving its SETs on the nodes for the whole ttl.
-- The retry policy's calls and the sleeps between attempts are outside it
-- (the sleeping and awake hooks): nothing is in flight then, so a signal
-- ends the host at once (also while a policy has yielded a coroutine that
-- is never resumed), and the next attempt never begins.

-- How long an acquisition may take once a signal came: an attempt (two
-- rounds with a fencing token, on connections still being made), the
-- releases after a failed one, and a second to spare.
local function acquire_bound(dlm)
    local o = type(dlm) == "table" and dlm.options
    if type(o) ~= "cdata" then return 0 end -- misuse: the library raises before sending
    return 2 * (o.node_timeout_ms + o.connect_timeout_ms) + 1000
end

local function guard_acquisitions()
    local sys = require "redlock.host.sys"
    local bound = 0 -- the acquisition's under way, for its attempts after a sleep
    require("redlock").hooks {
        acquiring = function(dlm)
            bound = acquire_bound(dlm)
            sys.acquire_begin(bound)
        end,
        acquired = sys.acquire_end,
        sleeping = sys.acquire_end,
        awake = function() sys.acquire_begin(bound) end,
    }
end

--- Make redlock.default() return a client built from the host configuration,
-- and make keep-alive the default for every client created in the host (so
-- that the signal thread's rl_keeper_release_all covers every held lock).
-- Return redlock, or nil and a message when the label or prefix is one a
-- client refuses (check_label_and_prefix): nothing is installed then.
function _M.install(opts)
    local ok, lerr = _M.check_label_and_prefix(opts)
    if not ok then return nil, lerr end
    local redlock = require "redlock"
    guard_acquisitions()
    local copts, err = _M.client_options(opts)
    if copts then
        redlock.configure(copts)
        redlock.hooks { client_defaults = { keepalive = true, label = copts.label } }
    else
        -- no servers in the flags: the script may still set REDLOCK_SERVERS
        -- (or call configure) before its first redlock.default()
        redlock.hooks {
            client_defaults = { keepalive = true, label = _M.label(opts) },
            default_servers = function()
                local servers = _M.servers({})
                if servers then return servers end
                error(setmetatable({ msg = err }, USAGE_MT), 2)
            end,
        }
    end
    return redlock
end

-- The flag that sets each tls option.
local FLAG_OF_TLS_OPTION = {}
for flag, option in pairs(TLS_FLAGS) do FLAG_OF_TLS_OPTION[option] = flag end

--- msg (from redlock.new or a probe) with every "tls.<option>" in it said
--- as what set that option (see tls_options): "--<flag>" when the flag was
--- given, else its REDLOCK_* variable when that is set, else the flag (the
--- one to give). A file name in '...' is left as it is. opts: the command
--- line's options.
function _M.flag_message(msg, opts)
    local variable = require("redlock.options").TLS_ENV
    local function said(option)
        local flag = FLAG_OF_TLS_OPTION[option]
        if not flag then return nil end
        if not (opts and opts[flag]) and env(variable[option]) then return variable[option] end
        return "--" .. flag
    end
    local parts, pos = {}, 1
    repeat
        local q1, q2 = msg:find("'[^']*'", pos)
        parts[#parts + 1] = msg:sub(pos, q1 and q1 - 1 or -1):gsub("%f[%w.]tls%.([%a_]+)", said)
        if q1 then parts[#parts + 1] = msg:sub(q1, q2) end
        pos = q2 and q2 + 1
    until not q1
    return table.concat(parts)
end

--- A client from the host configuration, or nil and a message.
function _M.client(opts)
    local copts, err = _M.client_options(opts)
    if not copts then return nil, err end
    guard_acquisitions()
    local redlock = require "redlock"
    local ok, dlm = pcall(redlock.new, copts)
    if not ok then
        local msg = tostring(dlm):gsub("^bad argument #1 to 'new' %((.*)%)$", "%1")
        return nil, _M.flag_message(msg, opts)
    end
    return dlm
end

-- Whether a failed attempt's detail says that a quorum of nodes refused
-- the fence counter (at its end, or not a counter): no attempt can succeed
-- before somebody repairs it (docs/fencing.md).
local function counter_refused(detail)
    if type(detail) ~= "table" or not detail.quorum then return false end
    local n = 0
    for _, node in ipairs(detail) do
        if type(node.error) == "string" and node.error:find("^fence counter ") then n = n + 1 end
    end
    return n >= detail.quorum
end

--- Acquire resource with keep-alive. o: ttl, margin, policy, nonblock, wait, fence, shared,
-- and unreachable: function(err, detail, ms) called after each failed
-- attempt that was not "busy", with how long the attempts have failed that
-- way. Without nonblock, wait or policy, waits as long as it takes; but
-- not for a fence counter that a quorum refuses (it gives up at once).
function _M.lock(dlm, resource, o)
    local sys = require "redlock.host.sys"
    local lopts = { ttl = o.ttl, keepalive = true, margin = o.margin, fence = o.fence or false,
                    shared = o.shared or false, limit = o.limit }
    if o.nonblock then return dlm:try_lock(resource, lopts) end
    local policy = o.policy or require("redlock").retry.forever()
    local since -- when the attempts began failing for another reason than busy
    lopts.wait = o.wait
    lopts.retry = function(attempt, err, detail)
        if err == "busy" then
            since = nil
        elseif counter_refused(detail) then
            return nil
        elseif o.unreachable then
            since = since or sys.now_ms()
            o.unreachable(err, detail, sys.now_ms() - since)
        end
        return policy(attempt, err, detail)
    end
    return dlm:lock(resource, lopts)
end

--- Sleep ms while serving dlm's connections (late replies, reconnects), so
-- that an idle client is never mistaken for a stalled node.
function _M.sleep(dlm, ms)
    if dlm.client ~= nil then
        require("redlock.cdefs").lib.rl_sleep(dlm.client, ms)
    else
        require("redlock.host.sys").sleep_ms(ms)
    end
end

function _M.release(lock)
    return lock:unlock()
end

function _M.lost(lock)
    return lock:lost()
end

function _M.remaining(lock)
    return lock:remaining()
end

-- A node state as a message says it: "pending" alone means nothing to
-- someone who has not read about tails.
local STATE_SAID = { pending = "pending (no reply yet when the round was decided)" }

--- Per-node lines for a failure's detail (a node's error with its control
--- bytes as \xNN: the node wrote it).
function _M.describe_detail(detail)
    local lines = {}
    for i, node in ipairs(detail) do
        local state = node.state or "?"
        if detail.message and state == "pending" then
            state = "not asked" -- refused before anything was sent (detail.message says why)
        end
        lines[#lines + 1] = ("  node %d %s: %s%s"):format(i, node.server or "?", STATE_SAID[state] or state,
            node.error and (" (" .. host.printable(node.error) .. ")") or "")
    end
    return table.concat(lines, "\n")
end

return _M
