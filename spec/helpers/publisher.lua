-- Spec helper script (run as its own OS process, not required):
--
--   luajit spec/helpers/publisher.lua PORT MODE MS PATTERN
--
-- Waits (up to 10 s) until the redis-server at 127.0.0.1:PORT has channels
-- matching PATTERN (PUBSUB CHANNELS: a waiter has subscribed), then
-- publishes on every one of them for MS ms, pipelined in batches of 64 a
-- millisecond apart:
--   MODE "garbage"   payloads no release sends: words, "0", "-1", "01",
--                    "1x", "", a 10-digit number, a number with a space
--   MODE "lookalike" what a release sends: "1" (a wake channel's word,
--                    and a listener count on a resource's channel)
--   MODE "big:N"     one message of N bytes on each channel, then exits
--                    (MS is ignored)
-- Prints one line at the end: "published=P received=R channels=C", R being
-- the sum of PUBLISH's replies (the subscribers each message reached).
-- LUA_PATH / LUA_CPATH come from the spawning spec.

local socket = require "socket"
local proc = require "helpers.proc"
local resp = require "helpers.resp"

local port, mode, ms, pattern = tonumber(arg[1]), arg[2], tonumber(arg[3]), arg[4]
local sock = assert(socket.connect("127.0.0.1", port))
sock:settimeout(30)

local function command(...)
  local t = { "*" .. select("#", ...) }
  for i = 1, select("#", ...) do
    local a = tostring((select(i, ...)))
    t[#t + 1] = "$" .. #a
    t[#t + 1] = a
  end
  return table.concat(t, "\r\n") .. "\r\n"
end

-- The channels matching pattern, once there are any.
local channels = {}
local deadline = proc.now_ms() + 10000
while #channels == 0 do
  assert(sock:send(command("PUBSUB", "CHANNELS", pattern)))
  local n = tonumber(assert(sock:receive("*l")):match("^%*(%d+)"))
  for _ = 1, n do
    local len = tonumber(assert(sock:receive("*l")):sub(2))
    channels[#channels + 1] = assert(sock:receive(len + 2)):sub(1, len)
  end
  if #channels == 0 then
    assert(proc.now_ms() < deadline, "no channel matching " .. pattern)
    proc.sleep_ms(5)
  end
end

local published, received = 0, 0

-- Send the commands, then read their integer replies.
local function pipeline(cmds)
  assert(sock:send(table.concat(cmds)))
  for _ = 1, #cmds do
    local line = assert(sock:receive("*l"))
    received = received + (tonumber(line:match("^:(%d+)")) or 0)
  end
  published = published + #cmds
end

local size = mode:match("^big:(%d+)$")
if size then
  local payload = ("x"):rep(tonumber(size))
  for _, ch in ipairs(channels) do
    received = received + (tonumber(resp.call(sock, "PUBLISH", ch, payload):match("^:(%d+)")) or 0)
  end
  published = #channels
else
  local payloads = mode == "garbage"
    and { "hello", "0", "-1", "01", "1x", "", "1234567890", "1 ", "released" }
    or { "1" }
  local batch = {}
  local stop_at, k = proc.now_ms() + ms, 0
  while proc.now_ms() < stop_at do
    for i = 1, 64 do
      k = k + 1
      batch[i] = command("PUBLISH", channels[k % #channels + 1], payloads[k % #payloads + 1])
    end
    pipeline(batch)
    proc.sleep_ms(1) -- a flood still (tens of thousands a second), leaving the machine some room
  end
end
io.write(("published=%d received=%d channels=%d\n"):format(published, received, #channels))
