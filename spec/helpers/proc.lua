-- Spec helper: background processes started from the shell, watched and
-- stopped strictly by pid (never by name).
--
-- A process started with spawn() is reparented to init once its shell exits;
-- init here may never reap it, so a dead process can linger as a zombie:
-- alive() reads /proc to tell the two apart.

local ffi = require "ffi"
local C = ffi.C

if not pcall(ffi.typeof, "rl_spec_timespec") then
  ffi.cdef [[
    typedef struct { long tv_sec; long tv_nsec; } rl_spec_timespec;
    int rl_spec_kill(int pid, int sig) asm("kill");
    int rl_spec_poll(void *fds, unsigned long nfds, int timeout) asm("poll");
    int rl_spec_clock_gettime(int clk, rl_spec_timespec *ts) asm("clock_gettime");
    int rl_spec_getpid(void) asm("getpid");
  ]]
end

local M = {}

--- The checkout's root (absolute), from this file's own path.
M.root = (function()
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local dir = src:match("^(.*)/spec/helpers/[^/]+$") or "."
  if dir:sub(1, 1) ~= "/" then
    local pwd = os.getenv("PWD")
    if not pwd then
      local p = assert(io.popen("pwd"))
      pwd = p:read("*l")
      p:close()
    end
    dir = dir == "." and pwd or (pwd .. "/" .. dir:gsub("^%./", ""))
  end
  return dir
end)()

--- The build tree (REDLOCK_BUILD_DIR, default build/), absolute.
M.build = (function()
  local b = os.getenv("REDLOCK_BUILD_DIR") or "build"
  return b:sub(1, 1) == "/" and b or (M.root .. "/" .. b)
end)()

local SIGNALS = { HUP = 1, INT = 2, QUIT = 3, KILL = 9, USR1 = 10, USR2 = 12, TERM = 15, CONT = 18, STOP = 19 }
local ESRCH = 3
local CLOCK_MONOTONIC = 1

local ts = ffi.new("rl_spec_timespec")

--- Monotonic clock, milliseconds (float).
function M.now_ms()
  C.rl_spec_clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

--- Wall clock, integer milliseconds (what `date +%s%3N` prints in a child).
function M.wall_ms()
  C.rl_spec_clock_gettime(0, ts) -- CLOCK_REALTIME
  return tonumber(ts.tv_sec) * 1000 + math.floor(tonumber(ts.tv_nsec) / 1e6)
end

--- Monotonic clock, integer microseconds (comparable across processes).
function M.now_us()
  C.rl_spec_clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1000000 + math.floor(tonumber(ts.tv_nsec) / 1000)
end

function M.sleep_ms(ms)
  C.rl_spec_poll(nil, 0, math.max(0, math.floor(ms)))
end

function M.getpid()
  return C.rl_spec_getpid()
end

function M.quote(s)
  s = tostring(s)
  assert(not s:find("%z"), "cannot pass a NUL byte through the shell")
  return "'" .. s:gsub("'", [['\'']]) .. "'"
end

function M.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

--- Write a file atomically (temporary name, then rename).
function M.write_file(path, text)
  local tmp = path .. ".tmp"
  local f = assert(io.open(tmp, "wb"))
  f:write(text)
  f:close()
  assert(os.rename(tmp, path))
end

--- True if pid exists and is not a zombie.
function M.alive(pid)
  if not pid then return false end
  if C.rl_spec_kill(pid, 0) ~= 0 and ffi.errno() == ESRCH then return false end
  local stat = M.read_file("/proc/" .. pid .. "/stat")
  if stat then
    local state = stat:match("^%d+ %b() (%a)")
    if state == "Z" or state == "X" then return false end
  end
  return true
end

--- The pids of live (not zombie) processes matching f(cmdline_args, pgrp),
-- read from /proc; cmdline_args is the list of the process's arguments.
function M.live_processes(f)
  local found = {}
  local ls = io.popen("ls /proc")
  for name in ls:lines() do
    local pid = tonumber(name)
    local stat = pid and M.read_file("/proc/" .. pid .. "/stat")
    if stat then
      local state, pgrp = stat:match("%) (%a) %-?%d+ (%-?%d+)")
      local cmd = M.read_file("/proc/" .. pid .. "/cmdline") or ""
      local argv = {}
      for a in cmd:gmatch("[^%z]+") do argv[#argv + 1] = a end
      if state and state ~= "Z" and state ~= "X" and f(argv, tonumber(pgrp)) then
        found[#found + 1] = pid
      end
    end
  end
  ls:close()
  return found
end

--- The live processes with one argument equal to arg.
function M.live_with_arg(arg)
  return M.live_processes(function(argv)
    for _, a in ipairs(argv) do if a == arg then return true end end
    return false
  end)
end

--- The live members of process group pgrp.
function M.live_in_group(pgrp)
  return M.live_processes(function(_, g) return g == pgrp end)
end

function M.kill(pid, sig)
  local signo = type(sig) == "number" and sig or SIGNALS[sig or "TERM"]
  assert(signo, "unknown signal " .. tostring(sig))
  return C.rl_spec_kill(pid, signo) == 0
end

--- Wait until pid has exited; true if it did within timeout_ms.
function M.wait_gone(pid, timeout_ms)
  local deadline = M.now_ms() + (timeout_ms or 5000)
  while M.alive(pid) do
    if M.now_ms() > deadline then return false end
    M.sleep_ms(5)
  end
  return true
end

--- Stop pid: SIGCONT + SIGTERM, then SIGKILL if it lingers. Idempotent.
function M.stop(pid)
  if not M.alive(pid) then return true end
  M.kill(pid, "CONT")
  M.kill(pid, "TERM")
  if M.wait_gone(pid, 3000) then return true end
  M.kill(pid, "KILL")
  return M.wait_gone(pid, 3000)
end

--- Start a shell command in the background; return its pid.
-- opts.out: file for its stdout and stderr (default /dev/null)
-- opts.env: table of environment variables to set
function M.spawn(argv, opts)
  opts = opts or {}
  local words = { "env" }
  for k, v in pairs(opts.env or {}) do words[#words + 1] = k .. "=" .. M.quote(v) end
  for _, a in ipairs(argv) do words[#words + 1] = M.quote(a) end
  local cmd = ("exec %s >%s 2>&1 </dev/null"):format(table.concat(words, " "),
    M.quote(opts.out or "/dev/null"))
  local p = assert(io.popen("sh -c " .. M.quote(cmd) .. " & echo $!"))
  local pid = tonumber(p:read("*l"))
  p:close()
  assert(pid, "spawn failed: " .. cmd)
  return pid
end

--- Start a LuaJIT process (argv: luajit and its arguments) in the background
-- that finds modules where this one does; return its pid. out: as for spawn.
function M.spawn_luajit(argv, out)
  return M.spawn(argv, { out = out, env = { LUA_PATH = package.path, LUA_CPATH = package.cpath } })
end

--- Wait until a file exists and is non-empty; return its contents.
function M.wait_file(path, timeout_ms)
  local deadline = M.now_ms() + (timeout_ms or 5000)
  repeat
    local s = M.read_file(path)
    if s and s ~= "" then return s end
    M.sleep_ms(5)
  until M.now_ms() > deadline
  error("timed out waiting for " .. path)
end

--- Run a shell command; return its output (stderr merged) and exit status.
function M.sh(cmd)
  local p = assert(io.popen("exec 2>&1; " .. cmd .. "; echo \"<rc=$?>\""))
  local out = p:read("*a")
  p:close()
  local body, rc = out:match("^(.-)<rc=(%d+)>%s*$")
  return body or out, tonumber(rc)
end

--- A fresh temporary directory; remove it with M.rmdir.
function M.tmpdir()
  local p = assert(io.popen("mktemp -d " .. M.quote((os.getenv("TMPDIR") or "/tmp") .. "/redlock-spec.XXXXXX")))
  local dir = p:read("*l")
  p:close()
  assert(dir and dir ~= "", "mktemp -d failed")
  return dir
end

--- True if the directory path exists.
function M.exists(path)
  local f = io.open(path .. "/", "rb")
  if not f then return false end
  f:close()
  return true
end

function M.rmdir(dir)
  if dir and dir:match("redlock%-spec%.") then
    os.execute("rm -rf -- " .. M.quote(dir))
  end
end

return M
