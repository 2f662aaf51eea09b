-- Spec helper script (run as its own OS process, not required):
--
--   luajit spec/helpers/fence_worker.lua MODE STOPFILE RESOURCE STORE_PORT TTL URL...
--
-- Until STOPFILE exists: lock RESOURCE for TTL ms, increment the value kept
-- by the store (a redis-server at 127.0.0.1:STORE_PORT) by a read, a short
-- pause and a write (two separate calls, so a stale holder can interleave),
-- unlock.
--
-- MODE "fenced": lock with fence = true; the read and the write go through
-- the store's fencing script (spec/helpers/fence_store.lua) with lock.token,
-- and the store refuses either when a higher token has been seen.
-- MODE "plain": lock without fencing; the store ignores tokens (GET/SET).
--
-- Optional, from the environment (spec/safety_persist_spec.lua):
--   FENCE_GRANTS=PATH  append "grant <t_us> <token> <pid>" for every lock
--                      granted, t_us being CLOCK_MONOTONIC when lock() returned
--   FENCE_LOG=PATH     append enter/exit around each read and write to the
--                      history log PATH (spec/helpers/history.lua), and count
--                      in late= the holds that ended with no validity left
--
-- Prints one line at the end:
--   "increments=N refused_reads=R refused_writes=W lock_failed=F errors=E:..."
-- increments counts the writes the store accepted (every write, in "plain").
-- LUA_PATH / LUA_CPATH come from the spawning spec.
local proc = require "helpers.proc"
local resp = require "helpers.resp"
local store = require "helpers.fence_store"
local socket = require "socket"
local redlock = require "redlock"

local mode, stopfile, resource, sport, ttl = arg[1], arg[2], arg[3], tonumber(arg[4]), tonumber(arg[5])
local urls = {}
for i = 6, #arg do urls[#urls + 1] = arg[i] end
assert(mode == "fenced" or mode == "plain", "mode: fenced or plain")

local conn = assert(socket.connect("127.0.0.1", sport))
conn:settimeout(10)
local pid = proc.getpid()
math.randomseed(pid)

local dlm = redlock.new { servers = urls, ttl = ttl }
local increments, refused_reads, refused_writes, failed = 0, 0, 0, 0
local errors, nerrors = {}, 0
local function note(e)
  nerrors = nerrors + 1
  if #errors < 5 then errors[#errors + 1] = e end
end

local grants = os.getenv("FENCE_GRANTS")
grants = grants and assert(io.open(grants, "ab"))
if grants then grants:setvbuf("no") end
local hlog = os.getenv("FENCE_LOG")
hlog = hlog and require("helpers.history").open(hlog)
local late = 0

local fence = mode == "fenced" or nil
while not io.open(stopfile, "rb") do
  local lock, err = dlm:lock(resource, { ttl = ttl, fence = fence, wait = 3000,
    retry = redlock.retry.jitter(1, 10, 1000000) })
  if not lock then
    failed = failed + 1
    note("lock:" .. tostring(err))
  elseif fence and not (type(lock.token) == "cdata" and type(lock.token_string) == "string") then
    -- Without a token there is nothing to fence with: stop here.
    note("no token: lock.token is " .. tostring(lock.token))
    lock:unlock()
    break
  else
    if grants then grants:write(("grant %d %s %d\n"):format(proc.now_us(), lock.token_string or "0", pid)) end
    if hlog then hlog:enter() end
    local v, rerr
    if fence then
      v, rerr = store.read(conn, lock.token, pid)
    else
      v = resp.call(conn, "EVAL", store.PLAIN_READ, "0", pid)
    end
    if v == nil then
      refused_reads = refused_reads + 1
    else
      proc.sleep_ms(math.random(20, 40))
      local ok, werr
      if fence then
        ok, werr = store.write(conn, lock.token, tonumber(v) + 1)
      else
        ok = resp.call(conn, "SET", store.PLAIN_KEY, tonumber(v) + 1) == "+OK"
      end
      if ok then
        increments = increments + 1
      elseif werr and werr:match("^%-STALE") then
        refused_writes = refused_writes + 1
      else
        note("write:" .. tostring(werr))
      end
    end
    if rerr and not rerr:match("^%-STALE") then note("read:" .. tostring(rerr)) end
    if hlog then
      hlog:exit()
      if lock:remaining() <= 0 then late = late + 1 end
    end
    lock:unlock() -- "not held" after a pause past the ttl: nothing to do
  end
  proc.sleep_ms(math.random(0, 3))
end
dlm:close()
conn:close()
if grants then grants:close() end
if hlog then hlog:close() end
io.write(("increments=%d refused_reads=%d refused_writes=%d lock_failed=%d late=%d errors=%d:%s\n")
  :format(increments, refused_reads, refused_writes, failed, late, nerrors, table.concat(errors, ",")))
