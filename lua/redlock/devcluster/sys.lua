-- redlock.devcluster.sys: what redlock.devcluster needs from the system
-- (redlock.devcluster has the whole picture): the clock, signals and
-- process liveness, free loopback ports, a temporary directory, and running
-- shell commands. Linux only; depends on nothing but LuaJIT's FFI.

local ffi = require "ffi"
local C = ffi.C

local _M = {}

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
_M.SIGNALS = {
    HUP = 1, INT = 2, QUIT = 3, KILL = 9, USR1 = 10, USR2 = 12, TERM = 15,
    CONT = 18, STOP = 19,
}

--- Milliseconds on the monotonic clock.
function _M.now_ms()
    local ts = ffi.new("rl_devcluster_timespec")
    C.rl_devcluster_clock_gettime(CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local now_ms = _M.now_ms

function _M.sleep_ms(ms)
    C.rl_devcluster_poll(nil, 0, ms)
end

local sleep_ms = _M.sleep_ms

local function strerror(e)
    return ffi.string(C.rl_devcluster_strerror(e))
end

--- Send signal number signo to pid. Returns true, or nil and the reason.
function _M.kill(pid, signo)
    if C.rl_devcluster_kill(pid, signo) ~= 0 then
        return nil, "kill " .. pid .. ": " .. strerror(ffi.errno())
    end
    return true
end

--- Quote one word for /bin/sh.
function _M.shell_quote(s)
    s = tostring(s)
    if s:find("%z") then
        error("cannot pass a NUL byte through the shell", 3)
    end
    return "'" .. s:gsub("'", [['\'']]) .. "'"
end

--- The contents of the file at path, or nil if it cannot be opened.
function _M.read_file(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local s = f:read("*a")
    f:close()
    return s
end

local read_file = _M.read_file

--- The last lines (default 10) of the log file at path.
function _M.log_tail(path, lines)
    local s = read_file(path)
    if not s or s == "" then return "(empty log)" end
    local all = {}
    for line in s:gmatch("[^\n]+") do all[#all + 1] = line end
    return table.concat(all, "\n", math.max(1, #all - (lines or 10) + 1))
end

--- Run a shell command, return its output and whether it exited with 0.
function _M.run(cmd)
    local p = assert(io.popen(cmd .. " 2>&1; echo \"<rc=$?>\""))
    local out = p:read("*a")
    p:close()
    local body, rc = out:match("^(.-)<rc=(%d+)>%s*$")
    return (body or out), tonumber(rc) == 0
end

--- True if pid names a process that has not exited (zombies count as exited).
function _M.pid_alive(pid)
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

local pid_alive = _M.pid_alive

--- Wait until every pid in list has exited; return the ones still alive.
function _M.wait_exit(pids, timeout_ms)
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

--- Reserve n distinct free TCP ports on 127.0.0.1: bind each to port 0 and
-- read back the port the kernel chose. All sockets stay open until every port
-- is known, so the kernel cannot hand out one port twice.
function _M.free_ports(n)
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

--- Create a fresh directory under $TMPDIR (or /tmp); return its path.
function _M.make_temp_dir()
    local base = os.getenv("TMPDIR") or "/tmp"
    local template = base .. "/redlock-dev.XXXXXX"
    local buf = ffi.new("char[?]", #template + 1, template)
    if C.rl_devcluster_mkdtemp(buf) == nil then
        error("devcluster: mkdtemp " .. template .. ": " .. strerror(ffi.errno()), 0)
    end
    return ffi.string(buf)
end

return _M
