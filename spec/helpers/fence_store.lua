-- Spec helper: a "fenced store" on one redis-server, the resource a fencing
-- token protects. It keeps one value and the highest token it has seen, and
-- refuses any read or write carrying a lower token (a write with the highest
-- token is accepted: one holder reads and writes with one token).
--
--   local store = require "helpers.fence_store"
--   store.read(sock, token, pid)      --> value (a string) or nil, "-STALE ..."
--   store.write(sock, token, value)   --> true or nil, "-STALE ..."
--   store.stats(sock)                 --> { value, hi, accepted, refused_reads,
--                                           refused_writes }
--
-- Every call is one EVAL, so the check and the update are atomic. The store
-- records the pid of the last accepted reader (the spec pauses it: a holder
-- in the middle of an increment) and counts accepted writes and refusals.
-- The "plain" store (PLAIN_READ, PLAIN_KEY) ignores tokens: a GET (that also
-- records the reader) and a SET.
local resp = require "helpers.resp"

local M = {}

-- Tokens are compared as decimal strings (by length, then bytes: exact for
-- positive integers without leading zeros, where tonumber is not past 2^53).
M.SCRIPT = [[
local t = ARGV[2]
local hi = redis.call('GET', 'fence:hi') or ''
local function below(a, b) return #a < #b or (#a == #b and a < b) end
if below(t, hi) then
  if ARGV[1] == 'read' then
    redis.call('INCR', 'fence:refused_reads')
  else
    redis.call('INCR', 'fence:refused_writes')
  end
  return redis.error_reply('STALE token ' .. ARGV[2] .. ' < ' .. hi)
end
if below(hi, t) then redis.call('SET', 'fence:hi', t) end
if ARGV[1] == 'read' then
  redis.call('SET', 'fence:reader', ARGV[3])
  return redis.call('GET', 'fence:value') or '0'
end
redis.call('SET', 'fence:value', ARGV[3])
redis.call('INCR', 'fence:accepted')
return redis.status_reply('OK')
]]

M.PLAIN_KEY = "plain:value"
M.PLAIN_READ = [[
redis.call('SET', 'plain:reader', ARGV[1])
return redis.call('GET', 'plain:value') or '0'
]]

--- A lock's token (an int64_t cdata) as the store takes it: decimal text.
local function token_text(token)
  assert(type(token) == "cdata" and token >= 1, "token must be a lock's token (int64_t cdata), got "
    .. tostring(token) .. " (" .. type(token) .. ")")
  return ("%d"):format(token)
end

function M.read(sock, token, pid)
  local r = resp.call(sock, "EVAL", M.SCRIPT, "0", "read", token_text(token), pid)
  if r == nil or r:match("^%-") then return nil, r end
  return r
end

function M.write(sock, token, value)
  local r = resp.call(sock, "EVAL", M.SCRIPT, "0", "write", token_text(token), value)
  if r == "+OK" then return true end
  return nil, r
end

local function num(sock, key)
  return tonumber(resp.call(sock, "GET", key) or "0")
end

function M.stats(sock)
  return {
    value = num(sock, "fence:value"),
    hi = num(sock, "fence:hi"),
    accepted = num(sock, "fence:accepted"),
    refused_reads = num(sock, "fence:refused_reads"),
    refused_writes = num(sock, "fence:refused_writes"),
  }
end

function M.plain_value(sock)
  return num(sock, M.PLAIN_KEY)
end

--- Pid of the last reader (fenced or plain), or nil.
function M.reader(sock, plain)
  return tonumber(resp.call(sock, "GET", plain and "plain:reader" or "fence:reader") or "")
end

return M
