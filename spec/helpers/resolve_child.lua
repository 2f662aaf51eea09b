-- Not a module: the program spec/resolve_spec.lua runs inside `unshare -m`,
-- where /etc/resolv.conf names rl-fakedns as the only nameserver.
--
--   luajit spec/helpers/resolve_child.lua URL1 URL2 SLOW_URL DNS_CONTROL CONNECT_TIMEOUT
--
-- URL1 and URL2 are real nodes; SLOW_URL names a host that only the fake
-- DNS server knows, and it starts deaf. Through the C API (whose results
-- carry every node's detail) it creates a client, runs lock/unlock cycles
-- while the lookup hangs, then tells the DNS server to answer and cycles on
-- until the slow node votes. The Lua API gets one client and cycle too. It
-- prints a tab-separated line per measurement and asserts nothing; the spec
-- reads the lines:
--   new        MS                  rl_client_new
--   round      OP MS STATUS OK STATE3 ERROR3   a round while the DNS is deaf
--   lua_new    MS                  redlock.new
--   lua_round  MS RESULT           try_lock + unlock
--   new_two_slow MS                rl_client_new with two slow names
--   recovered  MS                  from the DNS answering to the slow node voting
--                                  (or not_recovered MS: it never did)
--   answering  ROUNDS SLOWEST_MS FAILED   the rounds run meanwhile

local ffi = require "ffi"
local redlock = require "redlock"
local proc = require "helpers.proc"
local C = require("redlock.cdefs").lib

local urls = { arg[1], arg[2], arg[3] }
local control, connect_timeout = arg[4], tonumber(arg[5])
local NODE_TIMEOUT = 50
local CYCLES = 5
local RECOVERY_LIMIT_MS = 20000
local RECONNECT_MAX = 100 -- ms: the slow node is due for a connect attempt before every cycle

local function say(...)
  local t = { ... }
  for i = 1, #t do t[i] = tostring(t[i]) end
  io.write(table.concat(t, "\t"), "\n")
  io.flush()
end

local opts = ffi.new("rl_options")
C.rl_options_init(opts)
opts.node_timeout_ms = NODE_TIMEOUT
opts.connect_timeout_ms = connect_timeout
opts.reconnect_max_ms = RECONNECT_MAX
local list = ffi.new("const char *[3]", urls)
local err = ffi.new("char[?]", C.RL_ERR_LEN)

local t0 = C.rl_now_ms()
local client = C.rl_client_new(list, 3, opts, err, C.RL_ERR_LEN)
say("new", C.rl_now_ms() - t0)
if client == nil then
  say("error", ffi.string(err))
  os.exit(1)
end

local r = ffi.new("rl_result")
local n = 0

-- One acquire and its release. Returns, per round, { op, ms, status, ok,
-- slow node's state, its error }; the release's state of the slow node
-- tells whether it answered (a release hears every node).
local function cycle()
  n = n + 1
  local resource = ("spec:resolve:%d:%d"):format(proc.getpid(), n)
  local rounds = {}
  local function note(op, ms, status)
    rounds[#rounds + 1] = { op, ms, status, r.ok, r.node[2].state, ffi.string(r.node[2].errstr) }
  end
  local t = C.rl_now_ms()
  assert(C.rl_acquire(client, resource, #resource, 10000, r) == C.RL_OK, "acquire did not start")
  note("acquire", C.rl_now_ms() - t, r.status)
  if r.status == C.RL_STATUS_OK then
    local value = ffi.string(r.value)
    t = C.rl_now_ms()
    assert(C.rl_release(client, resource, #resource, value, r) == C.RL_OK, "release did not start")
    note("release", C.rl_now_ms() - t, r.status)
  end
  return rounds
end

-- Between cycles the loop is not driven, so the retry timer does not fire:
-- each acquire finds the slow node past its reconnect delay and starts the
-- connect attempt itself, inside the round.
for _ = 1, CYCLES do
  proc.sleep_ms(RECONNECT_MAX + 50)
  for _, round in ipairs(cycle()) do say("round", unpack(round)) end
end

t0 = C.rl_now_ms()
local dlm = redlock.new { servers = urls, node_timeout = NODE_TIMEOUT, connect_timeout = connect_timeout }
say("lua_new", C.rl_now_ms() - t0)
t0 = C.rl_now_ms()
local lock, lerr = dlm:try_lock(("spec:resolve:%d:lua"):format(proc.getpid()))
local unlocked = lock and lock:unlock()
say("lua_round", C.rl_now_ms() - t0, lock and unlocked and "ok" or tostring(lerr))
dlm:close()

-- Two slow names in one client are looked up together: one bound, not two.
-- The client is freed with both lookups still hanging (their threads clean
-- up after themselves).
local two = ffi.new("const char *[3]", { urls[1], "redis://slow-a.invalid:1", "redis://slow-b.invalid:2" })
t0 = C.rl_now_ms()
local client2 = C.rl_client_new(two, 3, opts, err, C.RL_ERR_LEN)
say("new_two_slow", C.rl_now_ms() - t0)
C.rl_client_free(client2)

-- The name becomes resolvable. The lookup in flight still waits out the
-- resolver's timeout; the one after it is answered, and a later connect
-- attempt takes its address. Rounds go on meanwhile, none waiting: one
-- "answering" line sums them up (rounds, slowest, failed ones). Here the
-- loop is driven between cycles: the retry timer starts the attempts.
proc.write_file(control, "answer 127.0.0.1\n")
t0 = C.rl_now_ms()
local count, slowest, failed, done = 0, 0, 0, nil
repeat
  for _, round in ipairs(cycle()) do
    count = count + 1
    slowest = math.max(slowest, round[2])
    if round[3] ~= C.RL_STATUS_OK or round[4] < 2 then failed = failed + 1 end
    if round[1] == "release" and (round[5] == C.RL_NODE_OK or round[5] == C.RL_NODE_TAKEN) then
      done = "recovered"
    end
  end
  if not done and C.rl_now_ms() - t0 > RECOVERY_LIMIT_MS then done = "not_recovered" end
  if not done then C.rl_sleep(client, 50) end
until done
say(done, C.rl_now_ms() - t0)
say("answering", count, slowest, failed)
C.rl_client_free(client)
