--- Throwaway local Redis clusters for development, demos and tests.
--
--   local devcluster = require "redlock.devcluster"
--   local cl = devcluster.start{ n = 5 }
--   local dlm = require("redlock").new{ servers = cl.urls }
--   ...
--   cl:stop()
--
-- start{} launches `n` independent redis-server processes (no persistence)
-- on free loopback ports, each daemonized with its pid file, log and working
-- directory in one directory, and waits until every node answers PING.
-- Nodes are only ever signalled by the pid they wrote, never by name.
--
-- Keep the cluster object referenced while you use it: when it is collected
-- (or the Lua state closes) its nodes are stopped, so a forgotten cluster
-- does not outlive its process's Lua state.
--
-- Linux only (uses /proc to tell a zombie from a live process, because a
-- daemonized node is reparented to an init that may never reap it).
-- Needs `redis-server` and `redis-cli` on PATH (or REDLOCK_REDIS_SERVER /
-- REDLOCK_REDIS_CLI naming them). Depends on nothing but LuaJIT's FFI.
--
-- This module is the API (start, the options and the cluster's methods);
-- redlock.devcluster.node has one node's command lines and the wait for its
-- PONG, redlock.devcluster.sys the clock, signals, ports and shell commands.

local sys = require "redlock.devcluster.sys"
local node = require "redlock.devcluster.node"

local SIGNALS, signal = sys.SIGNALS, sys.kill
local shell_quote, pid_alive, wait_exit = sys.shell_quote, sys.pid_alive, sys.wait_exit
local now_ms, sleep_ms, run = sys.now_ms, sys.sleep_ms, sys.run
local launch, await, cli_prefix = node.launch, node.await, node.cli_prefix

local _M = { _VERSION = "0.4.0" }
local mt = { __index = {} }
local cluster = mt.__index

local START_TIMEOUT_MS = 5000 -- a node must answer PING within this
local STOP_TIMEOUT_MS = 3000  -- a node must exit within this after SIGTERM
local START_ATTEMPTS = 5      -- fresh ports tried when a port was taken meanwhile

local OPTIONS = { n = true, dir = true, args = true, password = true, tls = true, wrap = true } -- start{}'s

-- True when t is a list of strings (keys 1..#t, nothing else).
local function is_word_list(t)
    if type(t) ~= "table" then return false end
    local count = 0
    for _, v in pairs(t) do
        if type(v) ~= "string" then return false end
        count = count + 1
    end
    return count == #t
end

local function check_index(self, i, fname)
    if type(i) ~= "number" or i < 1 or i > self.n or i % 1 ~= 0 then
        error(("bad argument #1 to '%s' (node index 1..%d expected, got %s)")
            :format(fname, self.n, tostring(i)), 3)
    end
end

--- Start a cluster.
-- opts.n        number of nodes (default 5)
-- opts.dir      directory for pid files, logs and working dirs (default: a
--               fresh temporary directory, removed by stop())
-- opts.args     list of extra redis-server arguments, e.g. { "--maxmemory", "1mb" }
-- opts.password started with --requirepass; urls and cli() carry it
-- opts.tls      serve TLS only: each node gets `--port 0 --tls-port P` and
--               urls become rediss://. Fields (paths):
--                 cert, key    the server certificate and its key (required)
--                 ca           CA bundle the node checks client certificates
--                              against, and cli() checks the node against (required)
--                 auth_clients "no" (default), "yes" or "optional"
--                 client_cert, client_key   a client certificate cli() presents
--                              (required when auth_clients is "yes": the
--                              readiness check and cli() use it)
-- opts.wrap     per-node command prefix: wrap[i] is a list of words run before
--               redis-server for node i (also on restart), e.g.
--               { [2] = { "env", "LD_PRELOAD=/path/shim.so" } }
-- Any other field, or a field of the wrong type, raises "bad argument #1 to
-- 'start'" naming it, before anything starts.
-- Returns the cluster; raises with the node's log tail if a node won't start.
function _M.start(opts)
    opts = opts or {}
    if type(opts) ~= "table" then
        error("bad argument #1 to 'start' (table expected, got " .. type(opts) .. ")", 2)
    end
    for k in pairs(opts) do
        if not OPTIONS[k] then
            error("bad argument #1 to 'start' (opts: unknown field " .. tostring(k) .. ")", 2)
        end
    end
    local n = opts.n or 5
    if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
        error("bad argument #1 to 'start' (opts.n must be a positive integer)", 2)
    end
    if opts.dir ~= nil and (type(opts.dir) ~= "string" or opts.dir == "") then
        error("bad argument #1 to 'start' (opts.dir must be a directory path)", 2)
    end
    if opts.args ~= nil and not is_word_list(opts.args) then
        error("bad argument #1 to 'start' (opts.args must be a list of strings)", 2)
    end
    if opts.wrap ~= nil then
        if type(opts.wrap) ~= "table" then
            error("bad argument #1 to 'start' (opts.wrap must be a table of word lists)", 2)
        end
        for i, words in pairs(opts.wrap) do
            if type(i) ~= "number" or i < 1 or i > n or i % 1 ~= 0 then
                error(("bad argument #1 to 'start' (opts.wrap: a key must be a node index 1..%d, got %s)")
                    :format(n, tostring(i)), 2)
            end
            if not is_word_list(words) then
                error(("bad argument #1 to 'start' (opts.wrap[%d] must be a list of strings)"):format(i), 2)
            end
        end
    end
    if opts.password ~= nil and (type(opts.password) ~= "string" or opts.password == "") then
        error("bad argument #1 to 'start' (opts.password must be a non-empty string)", 2)
    end
    local tls
    if opts.tls ~= nil then
        if type(opts.tls) ~= "table" then
            error("bad argument #1 to 'start' (opts.tls must be a table)", 2)
        end
        tls = {}
        for _, k in ipairs { "cert", "key", "ca", "client_cert", "client_key" } do
            local v = opts.tls[k]
            local required = k == "cert" or k == "key" or k == "ca"
            if (v == nil and required) or (v ~= nil and (type(v) ~= "string" or v == "")) then
                error("bad argument #1 to 'start' (opts.tls." .. k .. " must be a file path)", 2)
            end
            tls[k] = v
        end
        if (tls.client_cert == nil) ~= (tls.client_key == nil) then
            error("bad argument #1 to 'start' (opts.tls.client_cert and opts.tls.client_key go together)", 2)
        end
        local ac = opts.tls.auth_clients or "no"
        if ac ~= "no" and ac ~= "yes" and ac ~= "optional" then
            error("bad argument #1 to 'start' (opts.tls.auth_clients must be \"no\", \"yes\" or \"optional\")", 2)
        end
        tls.auth_clients = ac
        if ac == "yes" and not tls.client_cert then
            -- The readiness check (redis-cli PING) must present a certificate.
            error("bad argument #1 to 'start' (opts.tls.auth_clients \"yes\" needs opts.tls.client_cert and client_key)", 2)
        end
        for k, _ in pairs(opts.tls) do
            if tls[k] == nil then
                error("bad argument #1 to 'start' (opts.tls: unknown field " .. tostring(k) .. ")", 2)
            end
        end
    end

    local self = setmetatable({
        n = n,
        ports = {},
        pids = {},
        urls = {},
        args = opts.args,
        wrap = opts.wrap,
        password = opts.password,
        tls = tls,
        dir = opts.dir,
        own_dir = opts.dir == nil,
    }, mt)
    if self.own_dir then
        self.dir = sys.make_temp_dir()
    else
        os.execute("mkdir -p " .. shell_quote(self.dir))
    end
    -- Stop the nodes if the cluster object is dropped without stop().
    local guard = newproxy(true)
    getmetatable(guard).__gc = function() self:stop() end
    self._guard = guard

    local ok, err = pcall(function()
        local pending = {}
        for i = 1, n do pending[i] = true end
        for _ = 1, START_ATTEMPTS do
            local todo = {}
            for i = 1, n do if pending[i] then todo[#todo + 1] = i end end
            if #todo == 0 then break end
            local ports = sys.free_ports(#todo)
            for k, i in ipairs(todo) do
                self.ports[i] = ports[k]
                local launched, why = launch(self, i)
                if not launched then error(why, 0) end
            end
            local deadline = now_ms() + START_TIMEOUT_MS
            for _, i in ipairs(todo) do
                local up, why, tail = await(self, i, deadline)
                if up then
                    pending[i] = nil
                elseif why == "port" then
                    -- Someone took the port between our probe and redis-server's bind:
                    -- forget this node and try again on a new port.
                    if self.pids[i] and pid_alive(self.pids[i]) then
                        signal(self.pids[i], SIGNALS.KILL)
                    end
                    self.pids[i] = nil
                else
                    error(("node %d (port %d) did not answer PING within %d ms; log tail:\n%s")
                        :format(i, self.ports[i], START_TIMEOUT_MS, tail), 0)
                end
            end
        end
        for i = 1, n do
            if pending[i] then
                error(("node %d: no free port after %d attempts"):format(i, START_ATTEMPTS), 0)
            end
        end
    end)
    if not ok then
        self:stop()
        error("devcluster: " .. tostring(err), 2)
    end

    for i = 1, n do
        local auth = self.password and (":" .. self.password .. "@") or ""
        self.urls[i] = (tls and "rediss://" or "redis://") .. auth .. "127.0.0.1:" .. self.ports[i]
    end
    return self
end

--- Stop every node (SIGTERM, SIGKILL if it lingers), wait until each has
-- exited and remove the temporary directory. Idempotent.
function cluster:stop()
    if self.stopped then return true end
    self.stopped = true
    local pids = {}
    for i = 1, self.n do
        local pid = self.pids[i]
        if pid and pid_alive(pid) then
            signal(pid, SIGNALS.CONT) -- a stopped node cannot handle TERM
            signal(pid, SIGNALS.TERM)
            pids[#pids + 1] = pid
        end
    end
    local left = wait_exit(pids, STOP_TIMEOUT_MS)
    for _, pid in ipairs(left) do signal(pid, SIGNALS.KILL) end
    left = wait_exit(left, STOP_TIMEOUT_MS)
    if self.own_dir and self.dir then
        os.execute("rm -rf -- " .. shell_quote(self.dir))
    end
    if #left > 0 then
        return nil, "devcluster: pids still alive after SIGKILL: " .. table.concat(left, " ")
    end
    return true
end

--- Send signal sig (a name such as "STOP", "CONT", "KILL", "TERM", or a
-- number) to node i. Returns true, or nil and the reason.
function cluster:kill(i, sig)
    check_index(self, i, "kill")
    local signo = type(sig) == "number" and sig or SIGNALS[tostring(sig or "TERM"):gsub("^SIG", "")]
    if not signo then
        error("bad argument #2 to 'kill' (unknown signal " .. tostring(sig) .. ")", 2)
    end
    local pid = self.pids[i]
    if not pid then return nil, "node " .. i .. " has no pid" end
    return signal(pid, signo)
end

--- Start node i again on its port (after kill) and wait until it answers
-- PING. A node that is still running is killed first. Raises on failure.
function cluster:restart(i)
    check_index(self, i, "restart")
    if self.stopped then error("devcluster: restart after stop", 2) end
    local old = self.pids[i]
    if old and pid_alive(old) then
        signal(old, SIGNALS.CONT)
        signal(old, SIGNALS.KILL)
        wait_exit({ old }, STOP_TIMEOUT_MS)
    end
    self.pids[i] = nil
    -- The port is ours, but a lingering connection may hold it for a moment.
    local deadline = now_ms() + START_TIMEOUT_MS
    local why, tail
    repeat
        local launched, err = launch(self, i)
        if not launched then error("devcluster: " .. err, 2) end
        local up
        up, why, tail = await(self, i, deadline)
        if up then return true end
        sleep_ms(50)
    until why ~= "port" or now_ms() > deadline
    error(("devcluster: node %d (port %d) did not restart; log tail:\n%s")
        :format(i, self.ports[i], tail or ""), 2)
end

--- Run `redis-cli -p PORT ...` against node i; return its trimmed output
-- (stdout, with stderr merged so connection failures are visible) and
-- whether redis-cli exited with status 0. Arguments are passed verbatim
-- (shell-quoted; they cannot hold NUL bytes). Against a node stopped with
-- SIGSTOP this blocks until the node is continued.
function cluster:cli(i, ...)
    check_index(self, i, "cli")
    local t = { cli_prefix(self, i) }
    for k = 1, select("#", ...) do t[#t + 1] = shell_quote((select(k, ...))) end
    local out, ok = run(table.concat(t, " "))
    return (out:gsub("^%s+", ""):gsub("%s+$", "")), ok
end

--- True if node i's process exists (and is not a zombie).
function cluster:alive(i)
    check_index(self, i, "alive")
    return pid_alive(self.pids[i])
end

--- Log file of node i (for diagnostics).
function cluster:log(i)
    check_index(self, i, "log")
    local _, logfile = node.files(self, i)
    return logfile
end

_M.shell_quote = shell_quote

return _M
