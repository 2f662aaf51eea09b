--- The host's system calls: the rl_host_* functions of core/host (declared in
-- core/host/host.h, exported from the `redlock` executable) and the few libc
-- functions the subcommands need. Only usable inside the host executable.

local ffi = require "ffi"
local bit = require "bit"
local C = ffi.C

local _M = {}

-- libc functions are renamed with asm("...") so these declarations never
-- clash with another module's declarations of the same functions.
if not pcall(ffi.typeof, "rl_host_timespec") then
    ffi.cdef [[
    typedef struct { long tv_sec; long tv_nsec; } rl_host_timespec;
    int rl_host_spawn(const char *const *argv, int flags, int grace_ms, int *errnum);
    int rl_host_wait(int pid, int block, int *code);
    void rl_host_forget(int pid);
    int rl_host_kill(int pid, int sig, int group);
    int rl_host_stop_self(int pid, int sig);
    int rl_host_group_alive(int pid);
    int rl_host_system(const char *cmd);
    void rl_host_defer_signals(int defer);
    int rl_host_pending_signal(void);
    void rl_host_acquire_begin(int bound_ms);
    void rl_host_acquire_end(void);
    void rl_host_sleep_ms(int ms);
    typedef struct rl_host_probe_result {
      int err;
      char errstr[256];
      char name[416];
      int exists;
      long long pttl;
      size_t value_len;
      unsigned long long value_digest;
      char value[128];
      int has_fence;
      size_t fence_len;
      long long fence_token;
      char fence[24];
      double latency_ms;
      int readers;
      char reader[64][41];
      long long reader_pttl[64];
      char run_id[41];
    } rl_host_probe_result;
    typedef struct rl_host_tls {
      const char *cafile, *capath, *certfile, *keyfile, *server_name;
      int verify;
    } rl_host_tls;
    int rl_host_probe(const char *url, const char *key, size_t keylen, int what, int timeout_ms,
                      const rl_host_tls *tls, rl_host_probe_result *out);
    int rl_host_probe_all(const char *const *urls, int n, const char *key, size_t keylen, int what,
                          int timeout_ms, const rl_host_tls *tls, rl_host_probe_result *out, int *rc);
    int rl_host_check_tls(const rl_host_tls *tls, rl_host_probe_result *out);
    int rl_host_libc_setenv(const char *name, const char *value, int overwrite) asm("setenv");
    int rl_host_libc_unsetenv(const char *name) asm("unsetenv");
    char *rl_host_libc_strerror(int errnum) asm("strerror");
    int rl_host_libc_getpid(void) asm("getpid");
    int rl_host_libc_gethostname(char *name, size_t len) asm("gethostname");
    int rl_host_libc_isatty(int fd) asm("isatty");
    int rl_host_libc_clock_gettime(int clk, rl_host_timespec *ts) asm("clock_gettime");
    typedef struct { int fd; short events; short revents; } rl_host_pollfd;
    int rl_host_libc_poll(rl_host_pollfd *fds, unsigned long n, int timeout) asm("poll");
    long rl_host_libc_write(int fd, const void *buf, size_t n) asm("write");
  ]]
end

_M.NEWPGRP, _M.SUPERVISE, _M.FOREGROUND, _M.DIE_WITH_HOST, _M.WATCHDOG = 1, 2, 4, 8, 16
_M.SIGHUP, _M.SIGINT, _M.SIGQUIT, _M.SIGKILL, _M.SIGTERM, _M.SIGCONT = 1, 2, 3, 9, 15, 18
_M.ENOENT, _M.EACCES, _M.ENOEXEC, _M.ECHILD, _M.ESRCH = 2, 13, 8, 10, 3
_M.PROBE_EINVAL, _M.PROBE_ENODE = 1, 2
_M.PROBE_LIMIT = -1 -- rl_host_probe's what for a semaphore's limit (RL_HOST_PROBE_LIMIT)
-- what a probe found under a lock's fence counter (RL_HOST_FENCE_*)
local FENCE_STRING, FENCE_OTHER_TYPE = 1, 2

local ts = ffi.new("rl_host_timespec")
local code_box = ffi.new("int[1]")

local stderr_poll = ffi.new("rl_host_pollfd[1]")
stderr_poll[0].fd, stderr_poll[0].events = 2, 4 -- POLLOUT

--- Write text to stderr only if that cannot block (a pipe whose reader has
-- stopped reading, a terminal stopped with Ctrl-S): true if written, false
-- if dropped. For what the host says while it supervises a command: a
-- blocked write there would keep it from stopping the command in time.
-- A short text (up to 4 KiB) goes whole into a pipe that polls writable.
function _M.say_now(text)
    if C.rl_host_libc_poll(stderr_poll, 1, 0) ~= 1 or bit.band(stderr_poll[0].revents, 4) == 0 then return false end
    return C.rl_host_libc_write(2, text, #text) > 0
end

--- Monotonic clock in milliseconds (the same clock as rl_now_ms).
function _M.now_ms()
    C.rl_host_libc_clock_gettime(7, ts) -- CLOCK_BOOTTIME
    return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

function _M.sleep_ms(ms)
    C.rl_host_sleep_ms(math.max(0, math.floor(ms)))
end

function _M.strerror(e)
    return ffi.string(C.rl_host_libc_strerror(e))
end

function _M.getpid()
    return C.rl_host_libc_getpid()
end

local hostname_buf = ffi.new("char[256]")

--- This machine's host name ("" if it cannot be had).
function _M.hostname()
    if C.rl_host_libc_gethostname(hostname_buf, 255) ~= 0 then return "" end
    hostname_buf[255] = 0
    return ffi.string(hostname_buf)
end

function _M.isatty(fd)
    return C.rl_host_libc_isatty(fd) == 1
end

function _M.setenv(name, value)
    if value == nil then
        C.rl_host_libc_unsetenv(name)
    else
        C.rl_host_libc_setenv(name, tostring(value), 1)
    end
end

--- Start argv (a list of strings; argv[1] searched in PATH).
-- Return the pid, or nil, a message and the errno.
function _M.spawn(argv, flags, grace_ms)
    local n = #argv
    local cargv = ffi.new("const char *[?]", n + 1)
    for i = 1, n do cargv[i - 1] = argv[i] end -- argv keeps the strings alive
    local pid = C.rl_host_spawn(cargv, flags or 0, grace_ms or 0, code_box)
    if pid < 0 then
        local e = code_box[0]
        return nil, _M.strerror(e), e
    end
    return pid
end

--- Reap pid. Return "running"; or "exited" and its status (128+signal when
-- killed); or "gone" and the errno when it was reaped elsewhere; with stops,
-- also "stopped" and the signal that stopped it.
function _M.wait(pid, block, stops)
    local r = C.rl_host_wait(pid, (block and 1 or 0) + (stops and 2 or 0), code_box)
    if r == 0 then return "running" end
    if r == 1 then return "exited", code_box[0] end
    if r == 2 then return "stopped", code_box[0] end
    return "gone", code_box[0]
end

--- Stop supervising pid, reaped, and what was left of its process group
-- (rl_host_forget): once the group has ended or been stopped.
function _M.forget(pid)
    C.rl_host_forget(pid)
end

--- pid (supervised) stopped with sig: if that is job control on a terminal,
-- stop the host the same way until it is continued, and return true
-- (rl_host_stop_self); any other stop is the child's alone.
function _M.stop_self(pid, sig)
    return C.rl_host_stop_self(pid, sig) == 1
end

function _M.kill(pid, sig, group)
    return C.rl_host_kill(pid, sig, group and 1 or 0) == 0
end

function _M.group_alive(pid)
    return C.rl_host_group_alive(pid) ~= 0
end

local probe_result = ffi.new("rl_host_probe_result")

--- Ask the node at url what it holds under key (rl_host_probe; key nil:
-- only PING it); tls: the options for a rediss:// node, as redlock.new
-- takes them (nil: defaults); what: nil for the lock's key, k for the
-- semaphore key's slot k, PROBE_LIMIT for the limit its waiters left
-- (named as the engine names them: on a cluster node after the key's
-- base; a cluster node is read at the master serving the key's slot).
-- Return { name =, exists =, value =, value_len =, value_digest =, pttl =,
-- fence =, fence_len =, fence_token =, fence_other_type =, latency_ms =,
-- readers =, shared =, run_id = }, where value is at most the first 127
-- bytes of the value (value_len is the whole length, value_digest a 64-bit
-- hash of all of it, in decimal), fence the first 23 bytes of the fenced
-- lock's counter (key:fence, <base>:fence on a cluster node) or nil
-- (fence_len its whole length, fence_token the token it is, in decimal, by
-- the engine's rule, or nil; fence_other_type when a key of another type
-- holds the counter's name),
-- and with the shared holders' mark in the key, readers is their number
-- and shared a list of { value =, pttl = } (the 64 that expire first:
-- fewer than readers when it has more); or nil, a message, the kind
-- of failure (PROBE_EINVAL: bad URL; PROBE_ENODE: the node failed) and the
-- node's name.
local probe_tls = ffi.new("rl_host_tls")

-- tls (a table of strings, which stay alive in it through the call) as an rl_host_tls.
local function host_tls(tls)
    if not tls then return nil end
    local t = probe_tls
    t.cafile, t.capath, t.certfile = tls.cafile, tls.capath, tls.certfile
    t.keyfile, t.server_name = tls.keyfile, tls.server_name
    t.verify = tls.verify == false and 0 or 1
    return t
end

--- Whether tls's files make a TLS context, as a client's do (rl_host_check_tls):
--- true, or nil and why ("tls.cafile '/x': ...").
function _M.check_tls(tls)
    if not tls or C.rl_host_check_tls(host_tls(tls), probe_result) == 0 then return true end
    return nil, ffi.string(probe_result.errstr)
end

-- What the probe that filled r found (see _M.probe).
local function probe_found(r, rc)
    if rc ~= 0 then
        return nil, ffi.string(r.errstr), r.err, ffi.string(r.name)
    end
    local len, fence_len = tonumber(r.value_len), tonumber(r.fence_len)
    local shared = {}
    for i = 0, math.min(r.readers, ffi.sizeof(r.reader) / ffi.sizeof(r.reader[0])) - 1 do
        shared[#shared + 1] = { value = ffi.string(r.reader[i]), pttl = tonumber(r.reader_pttl[i]) }
    end
    return {
        readers = r.readers,
        shared = shared,
        name = ffi.string(r.name),
        exists = r.exists ~= 0,
        value = r.exists ~= 0 and ffi.string(r.value, math.min(len, ffi.sizeof(r.value) - 1)) or nil,
        value_len = len,
        value_digest = r.exists ~= 0 and tostring(r.value_digest):match("^%d+") or nil,
        pttl = tonumber(r.pttl),
        fence = r.has_fence == FENCE_STRING and ffi.string(r.fence, math.min(fence_len, ffi.sizeof(r.fence) - 1))
            or nil,
        fence_len = fence_len,
        fence_token = r.fence_token ~= 0 and tostring(r.fence_token):match("^%d+") or nil,
        fence_other_type = r.has_fence == FENCE_OTHER_TYPE,
        latency_ms = r.latency_ms,
        run_id = r.run_id[0] ~= 0 and ffi.string(r.run_id) or nil,
    }
end

function _M.probe(url, key, timeout_ms, tls, what)
    local r = probe_result
    return probe_found(r, C.rl_host_probe(url, key, key and #key or 0, what or 0, timeout_ms, host_tls(tls), r))
end

--- _M.probe of every URL in urls at once (rl_host_probe_all: the nodes that
-- do not answer take timeout_ms between them): a list of { r, err, kind,
-- name }, one per URL in order, each what _M.probe returns for it.
function _M.probe_all(urls, key, timeout_ms, tls, what)
    local n = #urls
    if n == 0 then return {} end
    local curls = ffi.new("const char *[?]", n, urls)
    local out = ffi.new("rl_host_probe_result[?]", n)
    local rcs = ffi.new("int[?]", n)
    if C.rl_host_probe_all(curls, n, key, key and #key or 0, what or 0, timeout_ms, host_tls(tls), out, rcs) ~= 0 then
        error("redlock: out of memory probing " .. n .. " nodes")
    end
    local found = {}
    for i = 1, n do found[i] = { probe_found(out[i - 1], rcs[i - 1]) } end
    return found
end

--- With on true, SIGINT/SIGTERM/SIGHUP/SIGQUIT are only recorded; poll pending_signal().
function _M.defer_signals(on)
    C.rl_host_defer_signals(on and 1 or 0)
end

--- Around an acquisition (see rl_host_acquire_begin in core/host/host.h):
-- a signal waits for acquire_end, at most bound_ms; once one is ending the
-- host, neither returns.
function _M.acquire_begin(bound_ms)
    C.rl_host_acquire_begin(math.max(0, math.floor(bound_ms)))
end

function _M.acquire_end()
    C.rl_host_acquire_end()
end

function _M.pending_signal()
    local s = C.rl_host_pending_signal()
    return s ~= 0 and s or nil
end

return _M
