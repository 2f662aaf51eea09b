--- redlock run [OPTIONS] SCRIPT.lua [ARGS...]: run a Lua job script.
--
-- The script sees `arg` the standard way (arg[0] the script, arg[1..] its
-- arguments, arg[-1] down to arg[-k] the command line before the script:
-- the options, "run", and last the executable as invoked) and gets ARGS as `...`.
-- require "redlock" works; redlock.default() is a client built from
-- --servers / REDLOCK_SERVERS; every client made in the host keeps its locks
-- alive from a C thread. If the script returns a whole number from 0 to 255,
-- that is the exit status (false: 1); any other number is an error (exit 1,
-- with a message). A script error prints "redlock: message" and a traceback
-- and exits 1; redlock.default() without servers configured is a usage error
-- (64, no traceback). Every way out releases the locks still held first.

local host = require "redlock.host"
local args = require "redlock.host.args"
local config = require "redlock.host.config"

local EXIT = host.EXIT
local _M = {}


-- At most this many ARGS reach the script as `...` (LuaJIT's unpack stops
-- near 8000 values); more is a usage error rather than a failed call.
local MAX_ARGS = 7000

local SPEC = config.spec {}
_M.SPEC = SPEC

function _M.help()
    return ([[
Usage: redlock run [OPTIONS] SCRIPT.lua [ARGS...]

Run a Lua job script under LuaJIT. In the script, require "redlock" is the
Lua module, redlock.default() is a client for --servers / REDLOCK_SERVERS,
and `arg` and `...` hold ARGS. A job that writes a report under a lock

  local dlm = require("redlock").default()

  dlm:with_lock("nightly-report", { ttl = 10000 }, write_report)

has the lock kept alive by a C thread while write_report(lock) runs; there,
lock:check() raises "lost: ..." if the lock was lost. Locks are kept alive
by default in the host, and released on every way out: the end of the
script, an error, os.exit(), SIGINT (exit 130), SIGTERM (exit 143), SIGHUP
(exit 129), SIGQUIT (exit 131), and SIGPIPE when the script prints to a pipe
whose reader is gone (exit 141). (One taken with keepalive = false is the script's to
release; otherwise it stays until its ttl.) A script that returns a number
from 0 to 255 exits with it (another number is an error, exit 1); a script
error prints its message and a traceback and exits 1; redlock.default()
with no servers configured exits 64, and so does, before the script runs,
a --label or prefix that a client refuses.

Options (before SCRIPT):
%s
]]):format(args.describe(SPEC))
end

-- Drop the host's own frames from the bottom of a traceback; the message
-- (everything before "stack traceback:") stays whole, whatever it says.
local function trim_traceback(tb)
    local at, from = nil, 1
    while true do -- the last one: the message may hold the words too
        local i = tb:find("\nstack traceback:\n", from, true)
        if not i then break end
        at, from = i, i + 1
    end
    if not at then return tb end
    local out = { tb:sub(1, at - 1), "stack traceback:" }
    local frames = tb:sub(at + #"\nstack traceback:\n")
    for line in frames:gmatch("[^\n]+") do
        if line:find("[C]: in function 'xpcall'", 1, true)
            or line:find("redlock/host/run.lua:", 1, true) or line:find("redlock/host/init.lua:", 1, true) then
            break
        end
        out[#out + 1] = line
    end
    while #out > 2 and out[#out]:match("^%s*%[C%]: %?$") do out[#out] = nil end
    if #out == 2 then out[2] = nil end
    return table.concat(out, "\n")
end

local function handler(e)
    if config.is_usage_error(e) then return e end
    -- its control bytes escaped first: the traceback would end the message
    -- at a NUL
    return trim_traceback(debug.traceback(host.printable(host.error_text(e), true), 2))
end

function _M.run(opts, argv, k)
    local script = argv[k]
    if script == nil then return host.usage_error("run", "missing SCRIPT.lua") end
    -- Servers given are checked now, as exec and status do (bad URL, a
    -- server named twice): a usage error, not the script's;
    local servers, serr = config.servers(opts)
    if not servers and (opts.servers or opts.servers_file) then return host.fail(EXIT.USAGE, "%s", serr) end
    if servers then
        local ok, err = config.check_usable(servers, opts)
        if not ok then return host.fail(EXIT.USAGE, "%s", err) end
    end
    -- so are a label or prefix a client refuses (given or not with servers)
    local installed, ierr = config.install(opts)
    if not installed then return host.fail(EXIT.USAGE, "%s", ierr) end

    local chunk, err = loadfile(script ~= "-" and script or nil)
    if not chunk then return host.fail(EXIT.FAIL, "%s", err) end

    -- arg the standard way: the script at 0, its arguments from 1, the rest below.
    local sarg, n = {}, math.max(#argv - k, 0)
    for j = 0, #argv do sarg[j - k] = argv[j] end
    if n > MAX_ARGS then
        return host.usage_error("run", ("too many arguments for %s: %d (at most %d); pass a list in a file "
            .. "or on stdin"):format(script, n, MAX_ARGS))
    end
    _G.arg = sarg

    local res = { xpcall(function() return chunk(unpack(sarg, 1, n)) end, handler) }
    io.stdout:flush()
    if not res[1] then
        if config.is_usage_error(res[2]) then return host.fail(EXIT.USAGE, "%s", tostring(res[2])) end
        return host.fail(EXIT.FAIL, "%s", host.printable(res[2], true)) -- (it may quote a node's error)
    end
    local r = res[2]
    if type(r) == "number" then
        if r % 1 == 0 and r >= 0 and r <= 255 then return r end
        return host.fail(EXIT.FAIL, "%s returned %s: an exit status is a whole number from 0 to 255",
            script, tostring(r))
    end
    if r == false then return EXIT.FAIL end
    return EXIT.OK
end

return _M
