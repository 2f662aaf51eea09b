--- redlock status RESOURCE: per node, whether the key exists, a prefix of its
-- value and its PTTL; whether one value holds a quorum.
--
-- Reads the nodes directly with hiredis' blocking API (linked into the host),
-- so it shows what is really on each node, whatever client wrote it.

local ffi = require "ffi"
local host = require "redlock.host"
local args = require "redlock.host.args"
local config = require "redlock.host.config"

local C = ffi.C
local EXIT = host.EXIT
local _M = {}

local TIMEOUT_MS = 500

if not pcall(ffi.typeof, "rl_host_redisReply") then
  ffi.cdef [[
    typedef struct rl_host_redisReply {
      int type; long long integer; size_t len; char *str;
      size_t elements; struct rl_host_redisReply **element;
    } rl_host_redisReply;
    typedef struct { int err; char errstr[128]; } rl_host_redisContext;
    typedef struct { long tv_sec; long tv_usec; } rl_host_timeval;
    rl_host_redisContext *rl_host_redisConnectWithTimeout(const char *ip, int port, rl_host_timeval tv)
      asm("redisConnectWithTimeout");
    rl_host_redisContext *rl_host_redisConnectUnixWithTimeout(const char *path, rl_host_timeval tv)
      asm("redisConnectUnixWithTimeout");
    int rl_host_redisSetTimeout(rl_host_redisContext *c, rl_host_timeval tv) asm("redisSetTimeout");
    void *rl_host_redisCommandArgv(rl_host_redisContext *c, int argc, const char **argv,
                                   const size_t *argvlen) asm("redisCommandArgv");
    void rl_host_freeReplyObject(void *reply) asm("freeReplyObject");
    void rl_host_redisFree(rl_host_redisContext *c) asm("redisFree");
  ]]
end

local NIL = {} -- a nil reply
local REPLY_STRING, REPLY_INTEGER, REPLY_NIL, REPLY_STATUS, REPLY_ERROR = 1, 3, 4, 5, 6

local SPEC = config.spec {}
_M.SPEC = SPEC

function _M.help()
  return ([[
usage: redlock status [OPTIONS] RESOURCE

Show, node by node, whether RESOURCE's key exists, the first characters of its
value (the holder's lock value), and its remaining time to live; then whether
one value is held by a quorum (N/2+1) of the nodes.

Options:
%s

Exit status: 0 held by a quorum, 1 not held by a quorum, 64 usage,
69 too few nodes answered to tell.
]]):format(args.describe(SPEC))
end

--- Split a server URL like the core does (redis://[[user]:password@]host:port[/db],
-- unix:///path[?db=N]). Return a table, or nil and a message.
local function parse_url(url)
  local function unescape(s)
    return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
  end
  local path, q = url:match("^unix://(/[^?]*)(.*)$")
  if path then
    local db = q:match("^%?db=(%d+)$")
    if q ~= "" and not db then return nil, url .. ": the only query a unix URL takes is ?db=N" end
    return { path = path, db = tonumber(db), name = "unix://" .. path }
  end
  local rest = url:match("^redis://(.*)$")
  if not rest then return nil, url .. ": expected redis://host:port or unix:///path" end
  local user, password
  local userinfo, hostpart = rest:match("^(.*)@([^@]*)$")
  if userinfo then
    rest = hostpart
    local u, p = userinfo:match("^([^:]*):(.*)$")
    if u then user, password = unescape(u), unescape(p) else password = unescape(userinfo) end
    if user == "" then user = nil end
  end
  local hostname, port, tail = rest:match("^%[([^%]]+)%]:?(%d*)(.*)$")
  if not hostname then hostname, port, tail = rest:match("^([^:/]+):?(%d*)(.*)$") end
  if not hostname then return nil, url .. ": missing host" end
  local db = tail:match("^/(%d+)$")
  if tail ~= "" and tail ~= "/" and not db then return nil, url .. ": bad database" end
  port = tonumber(port) or 6379
  return { host = hostname, port = port, user = user, password = password, db = tonumber(db),
           name = ("redis://%s%s:%d"):format(user and (user .. "@") or "", hostname, port) }
end

local function command(ctx, ...)
  local n = select("#", ...)
  local argv = ffi.new("const char *[?]", n)
  local lens = ffi.new("size_t[?]", n)
  local keep = { ... }
  for i = 1, n do
    argv[i - 1] = keep[i]
    lens[i - 1] = #keep[i]
  end
  local r = ffi.cast("rl_host_redisReply *", C.rl_host_redisCommandArgv(ctx, n, argv, lens))
  if r == nil then
    return nil, ctx.err ~= 0 and ffi.string(ctx.errstr) or "no reply"
  end
  local t, v = r.type, nil
  if t == REPLY_STRING or t == REPLY_STATUS then v = ffi.string(r.str, r.len)
  elseif t == REPLY_INTEGER then v = tonumber(r.integer)
  elseif t == REPLY_ERROR then
    local e = ffi.string(r.str, r.len)
    C.rl_host_freeReplyObject(r)
    return nil, e
  end
  C.rl_host_freeReplyObject(r)
  if v == nil then return NIL end
  return v
end

--- Ask one node about key. Return { value =, pttl = } (value nil if absent),
-- or nil and an error.
local function probe(url, key, timeout_ms)
  local u, err = parse_url(url)
  if not u then return nil, err end
  timeout_ms = timeout_ms or TIMEOUT_MS
  local tv = ffi.new("rl_host_timeval", math.floor(timeout_ms / 1000), (timeout_ms % 1000) * 1000)
  local ctx = u.path and C.rl_host_redisConnectUnixWithTimeout(u.path, tv)
    or C.rl_host_redisConnectWithTimeout(u.host, u.port, tv)
  if ctx == nil then return nil, "out of memory" end
  local ok, res, why = pcall(function()
    if ctx.err ~= 0 then return nil, ffi.string(ctx.errstr) end
    C.rl_host_redisSetTimeout(ctx, tv)
    local r, e
    if u.password then
      if u.user then r, e = command(ctx, "AUTH", u.user, u.password)
      else r, e = command(ctx, "AUTH", u.password) end
      if not r then return nil, "AUTH: " .. e end
    end
    if u.db then
      r, e = command(ctx, "SELECT", tostring(u.db))
      if not r then return nil, "SELECT: " .. e end
    end
    local value, pttl
    value, e = command(ctx, "GET", key)
    if not value then return nil, e end
    pttl, e = command(ctx, "PTTL", key)
    if not pttl then return nil, e end
    if value == NIL then value = nil end
    return { value = value, pttl = pttl }
  end)
  C.rl_host_redisFree(ctx)
  if not ok then return nil, tostring(res) end
  return res, why
end

function _M.run(opts, argv, k)
  local resource = argv[k]
  if resource == nil or resource == "" then return host.usage_error("status", "missing RESOURCE") end
  if argv[k + 1] ~= nil then return host.usage_error("status", "one RESOURCE at a time") end
  local servers, err = config.servers(opts)
  if not servers then return host.fail(EXIT.USAGE, "%s", err) end
  local key = (opts.prefix or os.getenv("REDLOCK_PREFIX") or "") .. resource
  local n = #servers
  local quorum = math.floor(n / 2) + 1

  local rows, votes, answered = {}, {}, 0
  for idx, url in ipairs(servers) do
    local r, perr = probe(url, key)
    local u = parse_url(url)
    local row = { name = u and u.name or url }
    if not r then
      row.state, row.info = "error", perr
    else
      answered = answered + 1
      if r.value then
        votes[r.value] = (votes[r.value] or 0) + 1
        row.state = "held"
        local shown = r.value:sub(1, 12) .. (#r.value > 12 and "..." or "")
        row.info = ("%-15s pttl %s"):format(shown,
          r.pttl >= 0 and (r.pttl .. " ms") or r.pttl == -1 and "none (no expiry!)" or "-")
      else
        row.state, row.info = "free", ""
      end
    end
    rows[idx] = row
  end

  local width = 4
  for _, row in ipairs(rows) do width = math.max(width, #row.name) end
  print(("resource '%s'%s on %d nodes, quorum %d"):format(resource,
    key ~= resource and (" (key '" .. key .. "')") or "", n, quorum))
  for idx, row in ipairs(rows) do
    print((("  %2d  %-" .. width .. "s  %-5s  %s"):format(idx, row.name, row.state, row.info)
      :gsub("%s+$", "")))
  end
  local best, count = nil, 0
  for v, c in pairs(votes) do
    if c > count then best, count = v, c end
  end
  if best and count >= quorum then
    print(("held: value %s... on %d of %d nodes (quorum %d)"):format(best:sub(1, 12), count, n, quorum))
    return EXIT.OK
  end
  if answered < quorum then
    print(("unknown: only %d of %d nodes answered (quorum %d)"):format(answered, n, quorum))
    return EXIT.UNAVAILABLE
  end
  if best then
    print(("not held: at most %d of %d nodes agree on a value (quorum %d)"):format(count, n, quorum))
  else
    print(("free: no node holds '%s'"):format(key))
  end
  return EXIT.FAIL
end

_M.parse_url = parse_url
_M.probe = probe
return _M
