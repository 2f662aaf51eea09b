-- Spec helper: real redis-server clusters (redlock.devcluster) plus
-- binary-safe inspection of keys on one node.
--
--   local cluster = require "helpers.cluster"
--   local cl = cluster.start(5)          -- devcluster object
--   cluster.get(cl, 1, "res\0x")         -- value or nil (raises if the node fails)
--   cluster.pttl(cl, 1, key)             -- ms, -2 if no key, -1 if no expiry
--   cluster.set_nx(cl, 1, key, value, px)
--   cluster.stop_all()                   -- every cluster started here
--   local res = cluster.names("core")    -- res("tag"): a fresh resource name
--
-- Keys travel hex-encoded inside an EVAL so that any byte (NUL included)
-- reaches the node intact through redis-cli and the shell.

local devcluster = require "redlock.devcluster"

local M = {}
local started = {}

function M.start(n, opts)
  opts = opts or {}
  opts.n = n or opts.n or 5
  local cl = devcluster.start(opts)
  started[#started + 1] = cl
  return cl
end

--- A maker of resource names for one spec file: names("core")("tag") is
-- "spec:core:tag:<pid>:<n>", a name no other call, file or run uses.
function M.names(file)
  local proc = require "helpers.proc"
  local n = 0
  return function(tag)
    n = n + 1
    return ("spec:%s:%s:%d:%d"):format(file, tag, proc.getpid(), n)
  end
end

function M.stop_all()
  for _, cl in ipairs(started) do cl:stop() end
  started = {}
end

local function hex(s)
  return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

local SCRIPT = [[
local k = (string.gsub(ARGV[1], '..', function(h) return string.char(tonumber(h, 16)) end))
local r = redis.call(ARGV[2], k, unpack(ARGV, 3))
if r == false then return '<nil>' end
return r
]]

--- Run COMMAND key args... on node i with a binary-safe key; return the raw
-- reply text (raises if redis-cli failed, e.g. the node is down).
function M.call(cl, i, command, key, ...)
  local out, ok = cl:cli(i, "EVAL", SCRIPT, "0", hex(key), command, ...)
  if not ok or out:match("^ERR") or out:match("^Could not connect") then
    error(("node %d: %s %q: %s"):format(i, command, key, out), 2)
  end
  return out
end

function M.get(cl, i, key)
  local v = M.call(cl, i, "GET", key)
  if v == "<nil>" then return nil end
  return v
end

function M.pttl(cl, i, key)
  return tonumber(M.call(cl, i, "PTTL", key))
end

function M.exists(cl, i, key)
  return tonumber(M.call(cl, i, "EXISTS", key)) == 1
end

--- SET key value NX PX px on node i; true if it was set.
function M.set_nx(cl, i, key, value, px)
  return M.call(cl, i, "SET", key, value, "NX", "PX", tostring(px)) == "OK"
end

function M.del(cl, i, key)
  return tonumber(M.call(cl, i, "DEL", key))
end

--- Calls of command (lower case, "set", "eval") node i has handled so far;
--- i nil: summed over every node.
function M.calls(cl, command, i)
  local total = 0
  for j = i or 1, i or cl.n do
    local out, ok = cl:cli(j, "INFO", "commandstats")
    assert(ok, out)
    total = total + (tonumber(out:match("cmdstat_" .. command .. ":calls=(%d+)")) or 0)
  end
  return total
end

--- Number of keys on node i.
function M.dbsize(cl, i)
  local out, ok = cl:cli(i, "DBSIZE")
  assert(ok, out)
  return tonumber(out)
end

--- Poll check(i) for every node i of cl until all hold, up to ms (default
-- 1000). An operation decided early at quorum may still be in flight to the
-- other nodes when it returns, so "on every node" is checked this way.
-- Returns true, or false and a text naming the nodes that never matched.
-- skip: optional set of node indexes not to look at (stalled nodes).
-- dlm: optional client to keep busy while waiting. The core is pull-style:
-- it does I/O only inside calls, so work left after an early decision
-- (a late reply to handle, a command to resend) may wait for the next call.
function M.await_all(cl, check, ms, skip, dlm)
  local proc = require "helpers.proc"
  local deadline = proc.now_ms() + (ms or 1000)
  while true do
    if dlm then M.drive(dlm) end
    local bad = {}
    for i = 1, cl.n do
      if not (skip and skip[i]) then
        local ok, why = check(i)
        if not ok then bad[#bad + 1] = ("node %d%s"):format(i, why and (": " .. tostring(why)) or "") end
      end
    end
    if #bad == 0 then return true end
    if proc.now_ms() > deadline then return false, table.concat(bad, "; ") end
    proc.sleep_ms(10)
  end
end

--- await_all for "node i holds value under key" (value nil: key absent).
function M.await_value(cl, key, value, ms, skip, dlm)
  return M.await_all(cl, function(i)
    local v = M.get(cl, i, key)
    return v == value, ("%s, expected %s"):format(tostring(v), tostring(value))
  end, ms, skip, dlm)
end

--- Make dlm do some I/O: one lock/unlock of a resource of its own.
function M.drive(dlm)
  local lock = dlm:try_lock("spec:drive", { ttl = 1000 })
  if lock then lock:unlock() end
end

--- One line describing a result's detail table, for assertion messages.
function M.show(detail)
  if type(detail) ~= "table" then return tostring(detail) end
  local parts = { ("ok=%s quorum=%s elapsed=%s"):format(tostring(detail.ok),
    tostring(detail.quorum), tostring(detail.elapsed)) }
  for i = 1, #detail do
    local d = detail[i]
    parts[#parts + 1] = ("[%d] %s %s%s"):format(i, tostring(d.server), tostring(d.state),
      d.error and (" (" .. tostring(d.error) .. ")") or "")
  end
  return table.concat(parts, "; ")
end

--- FLUSHALL on every node (between tests).
function M.flush(cl)
  for i = 1, cl.n do
    if cl:alive(i) then cl:cli(i, "FLUSHALL") end
  end
end

return M
