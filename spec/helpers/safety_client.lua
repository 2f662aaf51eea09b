-- Spec helper script (run as its own OS process, not required) for the
-- safety_*_spec.lua fault scenarios:
--
--   luajit spec/helpers/safety_client.lua MODE LOG RESOURCE TTL STORE_PORT HOLD READYFILE URL...
--
-- One holder: lock RESOURCE (ttl TTL ms, retrying for up to 20 s), append
-- "enter" to the history LOG (spec/helpers/history.lua), read the value kept
-- by the store at 127.0.0.1:STORE_PORT, write READYFILE, hold for HOLD
-- ms ("validity": until 200 ms of validity are left), write the value + 1,
-- append "exit", unlock. STORE_PORT 0: no store.
--
-- MODE "plain":  lock without fencing; the store ignores tokens (GET/SET).
-- MODE "fenced": lock with fence = true; the read and the write go through
--                the fenced store (spec/helpers/fence_store.lua) with
--                lock.token; the store refuses them once it saw a higher one.
-- MODE "kept":   dlm:with_lock (keep-alive); instead of reading and writing,
--                look at lock:lost() every millisecond for HOLD ms; once it is
--                true, check lock:check() raises, note when that was against
--                the validity the lock last had, and leave; then check that
--                with_lock raised, after its release, naming the resource.
--
-- Prints one line: "acquired=1 token=T read=V write=ok|stale|none
-- enter_us=U exit_us=U ..." (kept: "lost=1 learned_after_ms=X learned_at_ms=Y
-- check_raised=true with_lock_raised=true|false"), or "acquired=0 err=..."
-- and exits 1.
-- LUA_PATH / LUA_CPATH come from the spawning spec.
local proc = require "helpers.proc"
local history = require "helpers.history"
local resp = require "helpers.resp"
local store = require "helpers.fence_store"
local socket = require "socket"
local redlock = require "redlock"

local mode, logpath, resource, ttl, sport, hold, ready =
  arg[1], arg[2], arg[3], tonumber(arg[4]), tonumber(arg[5]), arg[6], arg[7]
local urls = {}
for i = 8, #arg do urls[#urls + 1] = arg[i] end
assert(mode == "plain" or mode == "fenced" or mode == "kept", "mode: plain, fenced or kept")

local pid = proc.getpid()
math.randomseed(pid)
local log = history.open(logpath)
local conn
if sport ~= 0 then
  conn = assert(socket.connect("127.0.0.1", sport))
  conn:settimeout(30)
end
local dlm = redlock.new { servers = urls, ttl = ttl }
local opts = { ttl = ttl, wait = 20000, fence = mode == "fenced" or nil,
  retry = redlock.retry.jitter(5, 20, 1000000) }

local function hold_for(lock)
  if hold == "validity" then
    while lock:remaining() > 200 do proc.sleep_ms(1) end
  else
    proc.sleep_ms(tonumber(hold))
  end
end

local out = {}
local function note(fmt, ...) out[#out + 1] = fmt:format(...) end

if mode == "kept" then
  local returned, ok, err = pcall(dlm.with_lock, dlm, resource, opts, function(lock)
    log:enter()
    note("acquired=1 enter_us=%d", proc.now_us())
    proc.write_file(ready, "held\n")
    local deadline = proc.now_ms() + tonumber(hold)
    while proc.now_ms() < deadline do
      if lock:lost() then
        local learned_at = proc.now_ms()
        local raised = not pcall(lock.check, lock)
        note("lost=1 learned_after_ms=%d learned_at_ms=%d valid_until_ms=%d check_raised=%s",
          learned_at - lock.valid_until, learned_at, lock.valid_until, tostring(raised))
        break
      end
      proc.sleep_ms(1)
    end
    log:exit()
    note("exit_us=%d", proc.now_us())
    return true
  end)
  if not returned then -- the loss, raised after the release ("lock on '<resource>' was lost ...")
    local named = tostring(ok):find("lock on '" .. resource .. "' was lost", 1, true) ~= nil
    note("with_lock_raised=%s", tostring(named))
    if not named then io.stderr:write("with_lock raised: ", tostring(ok), "\n") end
    ok = true
  elseif ok then
    note("with_lock_raised=false")
  end
  if not ok then
    io.write("acquired=0 err=", tostring(err), "\n")
    os.exit(1)
  end
else
  local lock, err = dlm:lock(resource, opts)
  if not lock then
    io.write("acquired=0 err=", tostring(err), "\n")
    os.exit(1)
  end
  log:enter()
  note("acquired=1 token=%s enter_us=%d", tostring(lock.token_string), proc.now_us())
  local v, rerr, wrote = "none", nil, "none"
  if conn then
    if mode == "fenced" then
      v, rerr = store.read(conn, lock.token, pid)
    else
      v = resp.call(conn, "EVAL", store.PLAIN_READ, "0", pid)
    end
  end
  proc.write_file(ready, "held\n") -- after the read: a pause from here on is mid-update
  hold_for(lock)
  if conn and v then
    local ok, werr
    if mode == "fenced" then
      ok, werr = store.write(conn, lock.token, tonumber(v) + 1)
    else
      ok = resp.call(conn, "SET", store.PLAIN_KEY, tonumber(v) + 1) == "+OK"
    end
    wrote = ok and "ok" or (werr and werr:match("^%-STALE") and "stale") or ("error:" .. tostring(werr))
  elseif conn then
    wrote = "refused_read:" .. tostring(rerr)
  end
  log:exit()
  note("read=%s write=%s exit_us=%d", tostring(v), wrote, proc.now_us())
  lock:unlock()
end
dlm:close()
log:close()
if conn then conn:close() end
io.write(table.concat(out, " "), "\n")
