-- Spec helper: a real nginx (with the lua module) started from a generated
-- config on a free loopback port, plus a small HTTP/1.0 client over LuaJIT
-- FFI sockets (no luasocket, no curl) that can run requests concurrently.
--
--   local nginx = require "helpers.nginx"     -- ("spec.helpers.nginx" from the root too)
--   local srv = nginx.start {
--     workers = 1,                              -- worker_processes (default 1)
--     package_path = nginx.root .. "/lua/?.lua",  -- lua_package_path, ";;" (defaults) appended
--     package_cpath = nginx.root .. "/build/?.so",
--     env = { "HOME", NODE_PORT = "6379" },     -- names passed through / set, as `env NAME;`
--     init = "...",                             -- init_by_lua_block body
--     init_worker = "...",                      -- init_worker_by_lua_block body
--     http = "...",                             -- extra http{} directives
--     server = "...",                           -- extra server{} directives
--     main = "...",                             -- extra main-context directives
--     locations = { "location /ping { content_by_lua_block { ngx.say('pong') } }" },
--     log_level = "notice",                     -- error_log level
--     lua_ssl_trusted_certificate = "/path/ca.crt", -- what cosockets verify TLS peers against
--     lua_ssl_verify_depth = 2,                 -- (both go in http{}; nil: nginx's defaults)
--     worker_connections = 1024,
--   }
--   srv.port, srv.pid (master), srv.prefix, srv.conf
--   local status, body, ms = srv:get("/ping")  -- nil, err, ms on a transport failure
--   local rs = srv:get_many({ "/a", { path = "/b", after_ms = 100 } }, 8)
--       -- rs[i] = { path, status, body, headers, err, elapsed_ms, started_ms, finished_ms }
--   local w = srv:wrk("/path", { threads = 2, connections = 300, seconds = 5 })
--       -- w = { requests, non2xx, socket_errors, rps, out } (nil, why when wrk is missing or failed)
--   srv:error_log()  srv:worker_pids()  srv:alive()  srv:stop{ graceful = false }
--   nginx.stop_all()                           -- every server started here
--   nginx.free_port()  nginx.request(port, path)  nginx.request_many(port, reqs, conc)
--   nginx.root                                 -- the checkout (absolute)
--
-- nginx runs as `nginx -p PREFIX -c PREFIX/nginx.conf -e PREFIX/error.log`
-- with `master_process on; daemon on;`: the foreground process exits only
-- after the config was read and the port bound, so its exit status tells
-- whether startup worked (a port taken meanwhile is retried on a new one).
-- The master is then signalled strictly by the pid in its pid file, and its
-- workers are found through /proc (ppid = master), never by name.
-- As root, `user <me> <my group>;` keeps the workers under the caller's
-- identity (nginx would otherwise drop them to nobody). Temp paths point into
-- the prefix so that a normal user needs no access to /var/lib/nginx.

local ffi = require "ffi"
local bit = require "bit"
local proc = require "helpers.proc"
local C = ffi.C

if not pcall(ffi.typeof, "rl_ngx_sockaddr_in") then
  ffi.cdef [[
    typedef struct {
      uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8];
    } rl_ngx_sockaddr_in;
    typedef struct { int fd; short events; short revents; } rl_ngx_pollfd;
    int rl_ngx_socket(int domain, int type, int protocol) asm("socket");
    int rl_ngx_bind(int fd, const void *addr, uint32_t len) asm("bind");
    int rl_ngx_connect(int fd, const void *addr, uint32_t len) asm("connect");
    int rl_ngx_getsockname(int fd, void *addr, uint32_t *len) asm("getsockname");
    int rl_ngx_getsockopt(int fd, int level, int name, void *val, uint32_t *len) asm("getsockopt");
    long rl_ngx_send(int fd, const void *buf, unsigned long n, int flags) asm("send");
    long rl_ngx_recv(int fd, void *buf, unsigned long n, int flags) asm("recv");
    int rl_ngx_close(int fd) asm("close");
    int rl_ngx_poll(rl_ngx_pollfd *fds, unsigned long nfds, int timeout) asm("poll");
    char *rl_ngx_strerror(int errnum) asm("strerror");
  ]]
end

local AF_INET, SOCK_STREAM, SOCK_NONBLOCK, SOCK_CLOEXEC = 2, 1, 0x800, 0x80000
local SOL_SOCKET, SO_ERROR = 1, 4
local MSG_NOSIGNAL = 0x4000
local POLLIN, POLLOUT, POLLERR, POLLHUP = 0x1, 0x4, 0x8, 0x10
local EINTR, EAGAIN, EINPROGRESS = 4, 11, 115
local SIGQUIT, SIGKILL = 3, 9

local START_ATTEMPTS = 5
local START_TIMEOUT_MS = 10000
local STOP_TIMEOUT_MS = 5000

local M = {}

local function strerror(e) return ffi.string(C.rl_ngx_strerror(e)) end

local function htons(p)
  if ffi.abi("le") then
    return bit.band(bit.bor(bit.rshift(p, 8), bit.lshift(bit.band(p, 0xff), 8)), 0xffff)
  end
  return p
end

local LOOPBACK = ffi.abi("le") and 0x0100007f or 0x7f000001

local function sockaddr(port)
  local sa = ffi.new("rl_ngx_sockaddr_in")
  sa.family = AF_INET
  sa.addr = LOOPBACK
  sa.port = htons(port or 0)
  return sa
end

--- The checkout's root and the build tree whose redlock_core.so the workers
-- load (REDLOCK_BUILD_DIR, default build/), both absolute.
M.root, M.build = proc.root, proc.build

--- A location answering /ping with "pong" (a request that never locks).
M.PING = "location = /ping { content_by_lua_block { ngx.say('pong') } }"

--- urls as a Lua list literal, for Lua source in an nginx.conf.
function M.lua_list(urls)
  local t = {}
  for i, u in ipairs(urls) do t[i] = ("%q"):format(u) end
  return "{" .. table.concat(t, ", ") .. "}"
end

--- A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read
-- back the port the kernel chose, close).
function M.free_port()
  local fd = C.rl_ngx_socket(AF_INET, SOCK_STREAM + SOCK_CLOEXEC, 0)
  if fd < 0 then error("socket: " .. strerror(ffi.errno())) end
  local sa = sockaddr(0)
  local ok, err = pcall(function()
    if C.rl_ngx_bind(fd, sa, ffi.sizeof(sa)) ~= 0 then
      error("bind 127.0.0.1:0: " .. strerror(ffi.errno()))
    end
    local len = ffi.new("uint32_t[1]", ffi.sizeof(sa))
    if C.rl_ngx_getsockname(fd, sa, len) ~= 0 then
      error("getsockname: " .. strerror(ffi.errno()))
    end
  end)
  C.rl_ngx_close(fd)
  if not ok then error(err, 2) end
  return htons(sa.port)
end

------------------------------------------------------------------------------
-- HTTP/1.0 client: one request per connection ("Connection: close"), the
-- response read until EOF, so nginx never chunks it.

local function parse_response(raw)
  local head, body = raw:match("^(.-)\r\n\r\n(.*)$")
  if not head then return nil, "malformed response: " .. raw:sub(1, 200) end
  local status = tonumber(head:match("^HTTP/%d%.%d (%d%d%d)"))
  if not status then return nil, "no status line: " .. head:sub(1, 200) end
  local headers = {}
  for k, v in head:gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do headers[k:lower()] = v end
  return status, body, headers
end

local RECV_SIZE = 65536
local recv_buf = ffi.new("uint8_t[?]", RECV_SIZE)
local errlen = ffi.new("uint32_t[1]")
local errval = ffi.new("int[1]")

local function finish(r, now, err)
  if r.fd and r.fd >= 0 then C.rl_ngx_close(r.fd) end
  r.fd = nil
  r.state = "done"
  r.finished_ms = now
  r.elapsed_ms = now - r.started_ms
  if err then
    r.err = err
    return
  end
  local raw = table.concat(r.chunks)
  local status, body, headers = parse_response(raw)
  if not status then r.err = body return end
  r.status, r.body, r.headers = status, body, headers
end

local function begin(r, port, now)
  r.started_ms = now
  r.chunks = {}
  r.sent = 0
  local fd = C.rl_ngx_socket(AF_INET, SOCK_STREAM + SOCK_NONBLOCK + SOCK_CLOEXEC, 0)
  if fd < 0 then return finish(r, now, "socket: " .. strerror(ffi.errno())) end
  r.fd = fd
  local sa = sockaddr(port)
  if C.rl_ngx_connect(fd, sa, ffi.sizeof(sa)) == 0 then
    r.state = "sending"
  else
    local e = ffi.errno()
    if e ~= EINPROGRESS then return finish(r, now, "connect: " .. strerror(e)) end
    r.state = "connecting"
  end
end

local function step(r, revents, now)
  if r.state == "connecting" then
    errlen[0] = ffi.sizeof("int")
    C.rl_ngx_getsockopt(r.fd, SOL_SOCKET, SO_ERROR, errval, errlen)
    if errval[0] ~= 0 then return finish(r, now, "connect: " .. strerror(errval[0])) end
    r.state = "sending"
  end
  if r.state == "sending" then
    local left = #r.request - r.sent
    local n = C.rl_ngx_send(r.fd, ffi.cast("const char *", r.request) + r.sent, left, MSG_NOSIGNAL)
    if n < 0 then
      local e = ffi.errno()
      if e ~= EAGAIN and e ~= EINTR then return finish(r, now, "send: " .. strerror(e)) end
    else
      r.sent = r.sent + tonumber(n)
      if r.sent == #r.request then r.state = "reading" end
    end
    return
  end
  if r.state == "reading" and bit.band(revents, POLLIN + POLLHUP + POLLERR) ~= 0 then
    while true do
      local n = C.rl_ngx_recv(r.fd, recv_buf, RECV_SIZE, 0)
      if n > 0 then
        r.chunks[#r.chunks + 1] = ffi.string(recv_buf, n)
      elseif n == 0 then
        return finish(r, now)
      else
        local e = ffi.errno()
        if e == EAGAIN then return end
        if e ~= EINTR then return finish(r, now, "recv: " .. strerror(e)) end
      end
    end
  end
end

--- Run HTTP GETs against 127.0.0.1:port, at most `concurrency` at once (default:
-- all), started in list order. Each item of reqs is a path or a table
-- { path = "/x", after_ms = N } (not started before N ms after the call).
-- opts.timeout_ms: per request (default 10000). opts.headers: extra header text.
-- Returns a list (same order) of tables:
--   { path, status, body, headers, elapsed_ms, started_ms, finished_ms, err }
-- where started_ms/finished_ms are relative to the call, and err is set (status
-- nil) on a transport failure or timeout.
function M.request_many(port, reqs, concurrency, opts)
  opts = opts or {}
  local timeout = opts.timeout_ms or 10000
  concurrency = concurrency or #reqs
  assert(concurrency >= 1, "concurrency must be >= 1")
  local t0 = proc.now_ms()
  local items = {}
  for i, q in ipairs(reqs) do
    if type(q) == "string" then q = { path = q } end
    assert(type(q.path) == "string" and q.path:sub(1, 1) == "/", "bad path in request " .. i)
    items[i] = {
      path = q.path, after_ms = q.after_ms or 0, state = "pending",
      request = ("GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n%s\r\n")
        :format(q.path, port, opts.headers or ""),
    }
  end
  local pfds = ffi.new("rl_ngx_pollfd[?]", math.max(1, concurrency))
  local ok, err = pcall(function()
    while true do
      local now = proc.now_ms() - t0
      -- time out, then start what may start (in list order)
      local active, left, next_start = {}, 0, nil
      for _, r in ipairs(items) do
        if r.state ~= "done" and r.state ~= "pending" then
          if now - r.started_ms > timeout then
            finish(r, now, ("timed out after %d ms (%s)"):format(timeout, r.state))
          else
            active[#active + 1] = r
          end
        end
      end
      for _, r in ipairs(items) do
        if r.state == "pending" then
          if r.after_ms > now then
            next_start = math.min(next_start or math.huge, r.after_ms)
          elseif #active < concurrency then
            begin(r, port, now)
            if r.state ~= "done" then active[#active + 1] = r end
          end
        end
        if r.state ~= "done" then left = left + 1 end
      end
      if left == 0 then break end
      local wait = 20
      if next_start then wait = math.max(0, math.min(wait, math.ceil(next_start - now))) end
      if #active == 0 then
        proc.sleep_ms(wait)
      else
        for k, r in ipairs(active) do
          pfds[k - 1].fd = r.fd
          pfds[k - 1].events = (r.state == "reading") and POLLIN or POLLOUT
          pfds[k - 1].revents = 0
        end
        local rc = C.rl_ngx_poll(pfds, #active, wait)
        if rc < 0 and ffi.errno() ~= EINTR then error("poll: " .. strerror(ffi.errno())) end
        if rc > 0 then
          now = proc.now_ms() - t0
          for k, r in ipairs(active) do
            local re = pfds[k - 1].revents
            if re ~= 0 then step(r, re, now) end
          end
        end
      end
    end
  end)
  for _, r in ipairs(items) do
    if r.fd then C.rl_ngx_close(r.fd); r.fd = nil end
  end
  if not ok then error(err, 2) end
  local out = {}
  for i, r in ipairs(items) do
    out[i] = {
      path = r.path, status = r.status, body = r.body, headers = r.headers, err = r.err,
      elapsed_ms = r.elapsed_ms, started_ms = r.started_ms, finished_ms = r.finished_ms,
    }
  end
  return out
end

--- One GET: status, body, elapsed_ms; or nil, error text, elapsed_ms.
function M.request(port, path, opts)
  local r = M.request_many(port, { path }, 1, opts)[1]
  if r.err then return nil, r.err, r.elapsed_ms end
  return r.status, r.body, r.elapsed_ms
end

------------------------------------------------------------------------------
-- nginx itself

local function sh_line(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  local s = p and p:read("*l")
  if p then p:close() end
  return s
end

local function nginx_binary()
  local env = os.getenv("REDLOCK_NGINX")
  if env and env ~= "" then return env end
  -- /usr/sbin is not on a normal user's PATH on Debian
  local found = sh_line("command -v nginx")
  if found and found ~= "" then return found end
  for _, p in ipairs { "/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/openresty/nginx/sbin/nginx" } do
    if io.open(p, "rb") then return p end
  end
  return "nginx"
end

local info -- what the installed nginx is, computed once
local function nginx_info()
  if info then return info end
  local bin = nginx_binary()
  local v = proc.sh(proc.quote(bin) .. " -V")
  local moddir = os.getenv("REDLOCK_NGINX_MODULES") or v:match("%-%-modules%-path=(%S+)")
    or "/usr/lib/nginx/modules"
  local modules = {}
  if not v:find("lua-nginx-module", 1, true) then -- not built in (OpenResty): load them
    for _, m in ipairs { "ndk_http_module.so", "ngx_http_lua_module.so" } do
      local path = moddir .. "/" .. m
      local f = io.open(path, "rb")
      if f then f:close(); modules[#modules + 1] = path end
    end
  end
  local temps = {}
  for _, t in ipairs { "proxy", "fastcgi", "uwsgi", "scgi" } do
    if not v:find("--without-http_" .. t .. "_module", 1, true) then temps[#temps + 1] = t end
  end
  local uid = tonumber(sh_line("id -u"))
  info = {
    bin = bin,
    version = v:match("nginx version: (%S+)"),
    modules = modules,
    temps = temps,
    root = uid == 0,
    user = sh_line("id -un"),
    group = sh_line("id -gn"),
  }
  return info
end
M.info = nginx_info

local READY = "/__rl_spec_nginx_ready"

local function env_lists(env)
  local directives, vars = {}, {}
  for k, v in pairs(env or {}) do
    if type(k) == "number" then
      assert(type(v) == "string" and v:match("^[%w_]+$"), "bad env name " .. tostring(v))
      directives[#directives + 1] = v
    else
      assert(type(k) == "string" and k:match("^[%w_]+$"), "bad env name " .. tostring(k))
      directives[#directives + 1] = k
      vars[k] = tostring(v)
    end
  end
  table.sort(directives)
  return directives, vars
end

local function with_defaults(path)
  if path:find(";;", 1, true) then return path end
  return (path:gsub(";*$", "")) .. ";;"
end

local function lua_string(s)
  -- an nginx double-quoted string
  assert(not s:find('[\n"]'), "nginx string may not hold a newline or a double quote: " .. s)
  return '"' .. s:gsub("\\", "\\\\") .. '"'
end

local function config(self, o, port)
  local ni = nginx_info()
  local p = self.prefix
  local L = {}
  local function add(s) L[#L + 1] = s end
  for _, m in ipairs(ni.modules) do add(("load_module %s;"):format(m)) end
  if ni.root then add(("user %s %s;"):format(ni.user, ni.group)) end
  add("master_process on;")
  add("daemon on;")
  add(("worker_processes %d;"):format(o.workers or 1))
  add(("error_log %s/error.log %s;"):format(p, o.log_level or "notice"))
  add(("pid %s/nginx.pid;"):format(p))
  for _, name in ipairs(self.env_directives) do add(("env %s;"):format(name)) end
  if o.main then add(o.main) end
  add(("events { worker_connections %d; }"):format(o.worker_connections or 1024))
  add("http {")
  add("  access_log off;")
  add(("  client_body_temp_path %s/tmp-client_body;"):format(p))
  for _, t in ipairs(ni.temps) do add(("  %s_temp_path %s/tmp-%s;"):format(t, p, t)) end
  if o.package_path then add(("  lua_package_path %s;"):format(lua_string(with_defaults(o.package_path)))) end
  if o.package_cpath then add(("  lua_package_cpath %s;"):format(lua_string(with_defaults(o.package_cpath)))) end
  if o.lua_ssl_trusted_certificate then
    add(("  lua_ssl_trusted_certificate %s;"):format(lua_string(o.lua_ssl_trusted_certificate)))
  end
  if o.lua_ssl_verify_depth then add(("  lua_ssl_verify_depth %d;"):format(o.lua_ssl_verify_depth)) end
  if o.init then add("  init_by_lua_block {\n" .. o.init .. "\n  }") end
  if o.init_worker then add("  init_worker_by_lua_block {\n" .. o.init_worker .. "\n  }") end
  if o.http then add(o.http) end
  add("  server {")
  add(("    listen 127.0.0.1:%d;"):format(port))
  add("    server_name localhost;")
  if o.server then add(o.server) end
  add(("    location = %s { return 204; }"):format(READY))
  for _, loc in ipairs(o.locations or {}) do add(loc) end
  add("  }")
  add("}")
  return table.concat(L, "\n") .. "\n"
end

local srv = {}
local srv_mt = { __index = srv }
local started = {}

local function ppid_of(pid)
  local stat = proc.read_file("/proc/" .. pid .. "/stat")
  if not stat then return nil end
  local state, ppid = stat:match("^%d+ %b() (%a) (%d+)")
  return tonumber(ppid), state
end

--- The live worker processes of the master (children of its pid), sorted.
function srv:worker_pids()
  local found = {}
  if not self.pid then return found end
  local ls = io.popen("ls /proc")
  for name in ls:lines() do
    local pid = tonumber(name)
    if pid then
      local ppid, state = ppid_of(pid)
      if ppid == self.pid and state ~= "Z" and state ~= "X" then
        local cmd = proc.read_file("/proc/" .. pid .. "/cmdline") or ""
        if cmd:find("^nginx: worker process") then found[#found + 1] = pid end
      end
    end
  end
  ls:close()
  table.sort(found)
  return found
end

--- True while the master is running (not a zombie).
function srv:alive()
  return self.pid ~= nil and proc.alive(self.pid)
end

--- The error log's text (plus whatever nginx printed on its stdout/stderr).
function srv:error_log()
  local log = proc.read_file(self.prefix .. "/error.log") or ""
  local out = proc.read_file(self.prefix .. "/nginx.out") or ""
  if out ~= "" then log = log .. "\n-- nginx stdout/stderr:\n" .. out end
  return log
end

function srv:get(path, opts) return M.request(self.port, path, opts) end

function srv:get_many(reqs, concurrency, opts)
  return M.request_many(self.port, reqs, concurrency, opts)
end

--- Load srv's path with wrk (threads, connections, seconds: -t -c -d; timeout
-- seconds: --timeout, default 10). Returns { requests, non2xx, socket_errors
-- (connect + read + write + timeout), rps, out (wrk's report) }, or nil and
-- why (no wrk, or no report).
function srv:wrk(path, o)
  o = o or {}
  local url = ("http://127.0.0.1:%d%s"):format(self.port, path)
  local out, rc = proc.sh(("wrk -t%d -c%d -d%ds --timeout %ds %s"):format(o.threads or 2, o.connections or 100,
    o.seconds or 5, o.timeout or 10, proc.quote(url)))
  local requests = tonumber(out:match("(%d+) requests in"))
  if rc ~= 0 or not requests then return nil, ("wrk exited %s: %s"):format(tostring(rc), out) end
  local errors = 0
  local c, r, w, t = out:match("Socket errors: connect (%d+), read (%d+), write (%d+), timeout (%d+)")
  if c then errors = tonumber(c) + tonumber(r) + tonumber(w) + tonumber(t) end
  return { requests = requests, non2xx = tonumber(out:match("Non%-2xx or 3xx responses: (%d+)")) or 0,
           socket_errors = errors, rps = tonumber(out:match("Requests/sec:%s*([%d.]+)")), out = out }
end

--- Stop nginx: SIGTERM (fast shutdown; opts.graceful: SIGQUIT) to the master,
-- wait until the master and every worker it had are gone (by /proc state),
-- SIGKILL whatever lingers, remove the prefix (unless opts.keep or
-- REDLOCK_SPEC_KEEP is set). Idempotent. Returns true, or nil and a reason.
function srv:stop(opts)
  opts = opts or {}
  if self.stopped then return true end
  self.stopped = true
  local pids = self:worker_pids()
  local left = {}
  if self.pid and proc.alive(self.pid) then
    table.insert(pids, 1, self.pid)
    proc.kill(self.pid, "CONT")
    proc.kill(self.pid, opts.graceful and SIGQUIT or "TERM")
  end
  local deadline = proc.now_ms() + STOP_TIMEOUT_MS
  for _, pid in ipairs(pids) do
    proc.wait_gone(pid, math.max(0, deadline - proc.now_ms()))
  end
  for _, pid in ipairs(pids) do
    if proc.alive(pid) then proc.kill(pid, SIGKILL) end
  end
  for _, pid in ipairs(pids) do
    if not proc.wait_gone(pid, 3000) then left[#left + 1] = pid end
  end
  if not (opts.keep or os.getenv("REDLOCK_SPEC_KEEP")) then proc.rmdir(self.prefix) end
  for i, s in ipairs(started) do
    if s == self then table.remove(started, i) break end
  end
  if #left > 0 then return nil, "nginx: pids still alive after SIGKILL: " .. table.concat(left, " ") end
  return true
end

--- M.start with this tree's Lua modules and the spec helpers on the
-- package path and its build on the C path (o.package_path and
-- o.package_cpath set here).
function M.start_tree(o)
  o.package_path = M.root .. "/lua/?.lua;" .. M.root .. "/lua/?/init.lua;" .. M.root .. "/spec/?.lua"
  o.package_cpath = M.build .. "/?.so"
  return M.start(o)
end

--- Start nginx (see the top of this file for opts). Raises, with the error
-- log, if it does not start and answer within 10 s.
function M.start(o)
  o = o or {}
  assert(o.workers == nil or (type(o.workers) == "number" and o.workers >= 1), "workers must be >= 1")
  local ni = nginx_info()
  local self = setmetatable({ prefix = proc.tmpdir(), workers = o.workers or 1 }, srv_mt)
  self.env_directives, self.env = env_lists(o.env)
  self.conf = self.prefix .. "/nginx.conf"
  -- stop nginx if the object is dropped without stop()
  local guard = newproxy(true)
  getmetatable(guard).__gc = function() self:stop() end
  self._guard = guard
  started[#started + 1] = self

  local ok, err = pcall(function()
    for attempt = 1, START_ATTEMPTS do
      local port = M.free_port()
      self.port = port
      proc.write_file(self.conf, config(self, o, port))
      os.remove(self.prefix .. "/error.log")
      local words = { "env" }
      for k, v in pairs(self.env) do words[#words + 1] = k .. "=" .. proc.quote(v) end
      for _, a in ipairs { ni.bin, "-p", self.prefix .. "/", "-c", self.conf, "-e", self.prefix .. "/error.log" } do
        words[#words + 1] = proc.quote(a)
      end
      local cmd = ("%s </dev/null >%s 2>&1"):format(table.concat(words, " "),
        proc.quote(self.prefix .. "/nginx.out"))
      local _, rc = proc.sh(cmd)
      if rc == 0 then break end
      local log = self:error_log()
      if not log:find("Address already in use", 1, true) or attempt == START_ATTEMPTS then
        error(("nginx did not start (exit %s); config %s; log:\n%s"):format(tostring(rc), self.conf, log), 0)
      end
    end
    self.pid = tonumber(proc.wait_file(self.prefix .. "/nginx.pid", START_TIMEOUT_MS):match("%d+"))
    assert(self.pid, "no pid in the pid file")
    local deadline = proc.now_ms() + START_TIMEOUT_MS
    while true do
      if not proc.alive(self.pid) then error("nginx master exited; log:\n" .. self:error_log(), 0) end
      if #self:worker_pids() >= self.workers then
        local status = M.request(self.port, READY, { timeout_ms = 1000 })
        if status == 204 then break end
      end
      if proc.now_ms() > deadline then
        error(("nginx did not answer within %d ms; log:\n%s"):format(START_TIMEOUT_MS, self:error_log()), 0)
      end
      proc.sleep_ms(10)
    end
  end)
  if not ok then
    self:stop()
    local kept = os.getenv("REDLOCK_SPEC_KEEP") and ("\n(prefix kept: " .. self.prefix .. ")")
      or "\n(REDLOCK_SPEC_KEEP=1 keeps the prefix)"
    error("helpers.nginx: " .. tostring(err) .. kept, 2)
  end
  return self
end

--- Stop every server started here and not stopped yet.
function M.stop_all()
  local list = {}
  for i, s in ipairs(started) do list[i] = s end
  for _, s in ipairs(list) do s:stop() end
end

return M
