--- redlock dev [N]: N throwaway redis-server nodes until Ctrl-C.

local host = require "redlock.host"
local args = require "redlock.host.args"
local sys = require "redlock.host.sys"

local EXIT = host.EXIT
local _M = {}

local SPEC = {
    { name = "dir", long = "dir", arg = "DIR",
        help = "keep pid files and logs in DIR (default: a fresh temporary directory)" },
    args.HELP,
}
_M.SPEC = SPEC

function _M.help()
    return ([[
Usage: redlock dev [OPTIONS] [N]

Start N (default 5) throwaway redis-server nodes on free loopback ports, with
no persistence, print the REDLOCK_SERVERS line to use, and keep them running
until Ctrl-C (or SIGTERM), which stops every one of them and exits 0.

Options:
%s
]]):format(args.describe(SPEC))
end

function _M.run(opts, argv, k)
    local n = 5
    if argv[k] ~= nil then
        n = argv[k]:match("^%d+$") and tonumber(argv[k])
        if not n or n < 1 or n > 16 then
            return host.usage_error("dev", ("N must be a number from 1 to 16, got '%s'"):format(argv[k]))
        end
        if argv[k + 1] ~= nil then return host.usage_error("dev", "unexpected '" .. argv[k + 1] .. "'") end
    end

    sys.defer_signals(true) -- Ctrl-C must reach the cleanup below, not end the process
    local ok, cl = pcall(require("redlock.devcluster").start, { n = n, dir = opts.dir })
    if not ok then
        sys.defer_signals(false)
        return host.fail(EXIT.UNAVAILABLE, "%s", host.printable(tostring(cl), true)) -- (with a node's log tail)
    end
    local line = "REDLOCK_SERVERS=" .. table.concat(cl.urls, ",")
    io.stdout:write(("redlock dev: %d redis-server node%s on 127.0.0.1 (pids %s), files in %s\n")
        :format(n, n == 1 and "" or "s", table.concat(cl.pids, " "), cl.dir))
    io.stdout:write("\nexport ", line, "\n\n")
    io.stdout:write("Ctrl-C stops them.\n")
    io.stdout:flush()

    local gone = {}
    while not sys.pending_signal() do
        for j = 1, n do
            if not gone[j] and not cl:alive(j) then
                gone[j] = true
                io.stderr:write(("redlock dev: node %d (port %d) is gone\n"):format(j, cl.ports[j]))
            end
        end
        sys.sleep_ms(100)
    end
    local stopped, err = cl:stop()
    io.stdout:write("\nredlock dev: stopped ", n, " node", n == 1 and "" or "s", "\n")
    io.stdout:flush()
    if not stopped then return host.fail(EXIT.FAIL, "%s", host.printable(tostring(err), true)) end
    return EXIT.OK
end

return _M
