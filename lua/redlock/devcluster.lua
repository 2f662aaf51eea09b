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

local ffi = require "ffi"
local C = ffi.C

local _M = { _VERSION = "0.3.0" }
local mt = { __index = {} }
local cluster = mt.__index

-- Every declaration is renamed with asm("...") so this module never clashes
-- with another module's declarations of the same libc functions.
if not pcall(ffi.typeof, "rl_devcluster_sockaddr_in") then
    ffi.cdef [[
    typedef struct {
      uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8];
    } rl_devcluster_sockaddr_in;
    typedef struct { long tv_sec; long tv_nsec; } rl_devcluster_timespec;
    int rl_devcluster_socket(int domain, int type, int protocol) asm("socket");
    int rl_devcluster_bind(int fd, const void *addr, uint32_t len) asm("bind");
    int rl_devcluster_getsockname(int fd, void *addr, uint32_t *len) asm("getsockname");
    int rl_devcluster_close(int fd) asm("close");
    int rl_devcluster_kill(int pid, int sig) asm("kill");
    int rl_devcluster_poll(void *fds, unsigned long nfds, int timeout) asm("poll");
    char *rl_devcluster_mkdtemp(char *template) asm("mkdtemp");
    char *rl_devcluster_strerror(int errnum) asm("strerror");
    int rl_devcluster_clock_gettime(int clk, rl_devcluster_timespec *ts) asm("clock_gettime");
  ]]
end

local AF_INET, SOCK_STREAM, SOCK_CLOEXEC = 2, 1, 0x80000
local CLOCK_MONOTONIC = 1
local ESRCH = 3

-- Linux signal numbers (x86, arm, arm64, riscv, ppc, s390 agree on these).
local SIGNALS = {
    HUP = 1, INT = 2, QUIT = 3, KILL = 9, USR1 = 10, USR2 = 12, TERM = 15,
    CONT = 18, STOP = 19,
}

local START_TIMEOUT_MS = 5000 -- a node must answer PING within this
local STOP_TIMEOUT_MS = 3000  -- a node must exit within this after SIGTERM
local START_ATTEMPTS = 5      -- fresh ports tried when a port was taken meanwhile

local REDIS_SERVER = os.getenv("REDLOCK_REDIS_SERVER") or "redis-server"
local REDIS_CLI = os.getenv("REDLOCK_REDIS_CLI") or "redis-cli"

local function now_ms()
    local ts = ffi.new("rl_devcluster_timespec")
    C.rl_devcluster_clock_gettime(CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local function sleep_ms(ms)
    C.rl_devcluster_poll(nil, 0, ms)
end

local function strerror(e)
    return ffi.string(C.rl_devcluster_strerror(e))
end

--- Quote one word for /bin/sh.
local function shell_quote(s)
    s = tostring(s)
    if s:find("%z") then
        error("cannot pass a NUL byte through the shell", 3)
    end
    return "'" .. s:gsub("'", [['\'']]) .. "'"
end

local function read_file(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local s = f:read("*a")
    f:close()
    return s
end

local function log_tail(path, lines)
    local s = read_file(path)
    if not s or s == "" then return "(empty log)" end
    local all = {}
    for line in s:gmatch("[^\n]+") do all[#all + 1] = line end
    return table.concat(all, "\n", math.max(1, #all - (lines or 10) + 1))
end

--- Run a shell command, return its output and whether it exited with 0.
local function run(cmd)
    local p = assert(io.popen(cmd .. " 2>&1; echo \"<rc=$?>\""))
    local out = p:read("*a")
    p:close()
    local body, rc = out:match("^(.-)<rc=(%d+)>%s*$")
    return (body or out), tonumber(rc) == 0
end

--- True if pid names a process that has not exited (zombies count as exited).
local function pid_alive(pid)
    if not pid then return false end
    if C.rl_devcluster_kill(pid, 0) ~= 0 and ffi.errno() == ESRCH then
        return false
    end
    local stat = read_file("/proc/" .. pid .. "/stat")
    if stat then
        local state = stat:match("^%d+ %b() (%a)")
        if state == "Z" or state == "X" then return false end
    end
    return true
end

--- Reserve n distinct free TCP ports on 127.0.0.1: bind each to port 0 and
-- read back the port the kernel chose. All sockets stay open until every port
-- is known, so the kernel cannot hand out one port twice.
local function free_ports(n)
    local fds, ports = {}, {}
    local ok, err = pcall(function()
        for i = 1, n do
            local fd = C.rl_devcluster_socket(AF_INET, bit.bor(SOCK_STREAM, SOCK_CLOEXEC), 0)
            if fd < 0 then error("socket: " .. strerror(ffi.errno())) end
            fds[i] = fd
            local sa = ffi.new("rl_devcluster_sockaddr_in")
            sa.family = AF_INET
            sa.addr = ffi.abi("le") and 0x0100007f or 0x7f000001 -- 127.0.0.1
            if C.rl_devcluster_bind(fd, sa, ffi.sizeof(sa)) ~= 0 then
                error("bind 127.0.0.1:0: " .. strerror(ffi.errno()))
            end
            local len = ffi.new("uint32_t[1]", ffi.sizeof(sa))
            if C.rl_devcluster_getsockname(fd, sa, len) ~= 0 then
                error("getsockname: " .. strerror(ffi.errno()))
            end
            local p = sa.port
            ports[i] = ffi.abi("le") and bit.bor(bit.rshift(p, 8), bit.lshift(bit.band(p, 0xff), 8)) or p
        end
    end)
    for _, fd in ipairs(fds) do C.rl_devcluster_close(fd) end
    if not ok then error("devcluster: no free port: " .. tostring(err), 0) end
    return ports
end

local function make_temp_dir()
    local base = os.getenv("TMPDIR") or "/tmp"
    local template = base .. "/redlock-dev.XXXXXX"
    local buf = ffi.new("char[?]", #template + 1, template)
    if C.rl_devcluster_mkdtemp(buf) == nil then
        error("devcluster: mkdtemp " .. template .. ": " .. strerror(ffi.errno()), 0)
    end
    return ffi.string(buf)
end

local function cli_prefix(self, i)
    local t = { shell_quote(REDIS_CLI), "-h", "127.0.0.1", "-p", tostring(self.ports[i]) }
    if self.password then
        t[#t + 1] = "-a " .. shell_quote(self.password) .. " --no-auth-warning"
    end
    local tls = self.tls
    if tls then
        t[#t + 1] = "--tls --cacert " .. shell_quote(tls.ca)
        if tls.client_cert then
            t[#t + 1] = "--cert " .. shell_quote(tls.client_cert)
                .. " --key " .. shell_quote(tls.client_key)
        end
    end
    return table.concat(t, " ")
end

local function node_files(self, i)
    local port = self.ports[i]
    return self.dir .. "/redis-" .. port .. ".pid", self.dir .. "/redis-" .. port .. ".log"
end

--- Launch node i (daemonized) on self.ports[i]; do not wait.
local function launch(self, i)
    local pidfile, logfile = node_files(self, i)
    os.remove(pidfile) -- a SIGKILLed node leaves its pid file behind
    local argv = { shell_quote(REDIS_SERVER) }
    local tls = self.tls
    if tls then
        -- The TLS port replaces the plain one: a TLS node has no plain listener.
        for _, a in ipairs {
            "--port", "0",
            "--tls-port", tostring(self.ports[i]),
            "--tls-cert-file", shell_quote(tls.cert),
            "--tls-key-file", shell_quote(tls.key),
            "--tls-ca-cert-file", shell_quote(tls.ca),
            "--tls-auth-clients", tls.auth_clients,
        } do argv[#argv + 1] = a end
    else
        argv[#argv + 1] = "--port"
        argv[#argv + 1] = tostring(self.ports[i])
    end
    for _, a in ipairs {
        "--bind", "127.0.0.1",
        "--save", "''",
        "--appendonly", "no",
        "--daemonize", "yes",
        "--pidfile", shell_quote(pidfile),
        "--logfile", shell_quote(logfile),
        "--dir", shell_quote(self.dir),
    } do argv[#argv + 1] = a end
    if self.password then
        argv[#argv + 1] = "--requirepass " .. shell_quote(self.password)
    end
    for _, a in ipairs(self.args or {}) do argv[#argv + 1] = shell_quote(a) end
    -- opts.wrap[i]: words run before redis-server for node i
    for k, w in ipairs(self.wrap and self.wrap[i] or {}) do table.insert(argv, k, shell_quote(w)) end
    local out, ok = run(table.concat(argv, " "))
    if not ok then
        return nil, "redis-server did not start: " .. out:gsub("%s+$", "")
    end
    return true
end

--- Wait until node i has written its pid file and answers PING.
-- Return true, or nil and a reason ("port" when the port was taken).
local function await(self, i, deadline)
    local pidfile, logfile = node_files(self, i)
    local pid
    while true do
        if not pid then
            pid = tonumber(read_file(pidfile) or "")
            if pid then self.pids[i] = pid end
        end
        if pid then
            if not pid_alive(pid) then break end
            local out = run(cli_prefix(self, i) .. " PING")
            if out:match("^%s*PONG%s*$") then return true end
        end
        if now_ms() > deadline then break end
        sleep_ms(10)
    end
    local tail = log_tail(logfile)
    if tail:find("Address already in use", 1, true) then
        return nil, "port", tail
    end
    return nil, "other", tail
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
-- Returns the cluster; raises with the node's log tail if a node won't start.
function _M.start(opts)
    opts = opts or {}
    if type(opts) ~= "table" then
        error("bad argument #1 to 'start' (table expected, got " .. type(opts) .. ")", 2)
    end
    local n = opts.n or 5
    if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
        error("bad argument #1 to 'start' (opts.n must be a positive integer)", 2)
    end
    if opts.args ~= nil and type(opts.args) ~= "table" then
        error("bad argument #1 to 'start' (opts.args must be a list of strings)", 2)
    end
    if opts.wrap ~= nil and type(opts.wrap) ~= "table" then
        error("bad argument #1 to 'start' (opts.wrap must be a table of word lists)", 2)
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
        self.dir = make_temp_dir()
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
            local ports = free_ports(#todo)
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
                        C.rl_devcluster_kill(self.pids[i], SIGNALS.KILL)
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

--- Wait until every pid in list has exited; return the ones still alive.
local function wait_exit(pids, timeout_ms)
    local deadline = now_ms() + timeout_ms
    while true do
        local left = {}
        for _, pid in ipairs(pids) do
            if pid_alive(pid) then left[#left + 1] = pid end
        end
        if #left == 0 or now_ms() > deadline then return left end
        sleep_ms(10)
    end
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
            C.rl_devcluster_kill(pid, SIGNALS.CONT) -- a stopped node cannot handle TERM
            C.rl_devcluster_kill(pid, SIGNALS.TERM)
            pids[#pids + 1] = pid
        end
    end
    local left = wait_exit(pids, STOP_TIMEOUT_MS)
    for _, pid in ipairs(left) do C.rl_devcluster_kill(pid, SIGNALS.KILL) end
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
    if C.rl_devcluster_kill(pid, signo) ~= 0 then
        return nil, "kill " .. pid .. ": " .. strerror(ffi.errno())
    end
    return true
end

--- Start node i again on its port (after kill) and wait until it answers
-- PING. A node that is still running is killed first. Raises on failure.
function cluster:restart(i)
    check_index(self, i, "restart")
    if self.stopped then error("devcluster: restart after stop", 2) end
    local old = self.pids[i]
    if old and pid_alive(old) then
        C.rl_devcluster_kill(old, SIGNALS.CONT)
        C.rl_devcluster_kill(old, SIGNALS.KILL)
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
    local _, logfile = node_files(self, i)
    return logfile
end

_M.shell_quote = shell_quote

return _M
