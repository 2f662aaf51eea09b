-- Spec helper: histories of critical sections and their checker.
--
-- Writers (worker processes) append one line per event to a shared log,
-- opened in append mode so each line is one atomic write:
--
--   enter <pid> <seq> <t_us>
--   exit  <pid> <seq> <t_us>
--
-- t_us is CLOCK_MONOTONIC in microseconds, one clock for every process on
-- the machine. An interval is (enter, exit) of one holder <pid>/<seq>.
--
-- check() counts:
--   acquisitions  intervals with both enter and exit
--   overlaps      pairs of intervals of different holders that intersect
--   unfinished    holders that entered and never exited
--   malformed     lines that are not events, or an exit without its enter
--   most, over_limit  (opts.limit: a semaphore's) the most holders at once,
--                 and the enters that made them more than the limit
--   lost_updates  acquisitions - final counter (when a counter is given):
--                 each critical section increments a shared counter file
--                 by read-modify-write, so any interleaving loses updates

local proc = require "helpers.proc"

local M = {}

local Log = {}
Log.__index = Log

--- Open the shared log for appending events.
function M.open(path)
  local f = assert(io.open(path, "ab"))
  f:setvbuf("no")
  return setmetatable({ f = f, pid = proc.getpid(), seq = 0 }, Log)
end

function Log:enter()
  self.seq = self.seq + 1
  self.f:write(("enter %d %d %d\n"):format(self.pid, self.seq, proc.now_us()))
end

function Log:exit()
  self.f:write(("exit %d %d %d\n"):format(self.pid, self.seq, proc.now_us()))
end

function Log:close()
  self.f:close()
end

--- Read the counter file (0 if absent or empty).
function M.read_counter(path)
  return tonumber(proc.read_file(path) or "") or 0
end

--- Increment the counter file by read-modify-write (deliberately not atomic).
function M.bump_counter(path, pause_ms)
  local v = M.read_counter(path)
  if pause_ms and pause_ms > 0 then proc.sleep_ms(pause_ms) end
  local f = assert(io.open(path, "wb"))
  f:write(tostring(v + 1))
  f:close()
end

--- Parse log text into intervals { holder, enter, exit } and counts.
function M.parse(text)
  local open, intervals, malformed = {}, {}, 0
  for line in text:gmatch("[^\n]+") do
    local kind, pid, seq, t = line:match("^(%a+) (%d+) (%d+) (%d+)$")
    local holder = pid and (pid .. "/" .. seq)
    t = tonumber(t)
    if kind == "enter" and not open[holder] then
      open[holder] = { holder = holder, enter = t }
    elseif kind == "exit" and open[holder] and t >= open[holder].enter then
      open[holder].exit = t
      intervals[#intervals + 1] = open[holder]
      open[holder] = nil
    else
      malformed = malformed + 1
    end
  end
  local unfinished = 0
  for _ in pairs(open) do unfinished = unfinished + 1 end
  return intervals, unfinished, malformed
end

--- Count pairs of intervals of different holders that intersect.
-- Returns the count and up to 5 examples ("a [t1,t2] x b [t3,t4]").
function M.overlaps(intervals)
  table.sort(intervals, function(a, b) return a.enter < b.enter end)
  local count, examples = 0, {}
  -- Sweep: every earlier interval still open at this one's enter overlaps it.
  local active = {}
  for _, iv in ipairs(intervals) do
    local still = {}
    for _, a in ipairs(active) do
      if a.exit > iv.enter then
        still[#still + 1] = a
        if a.holder ~= iv.holder then
          count = count + 1
          if #examples < 5 then
            examples[#examples + 1] = ("%s [%d,%d] x %s [%d,%d]")
              :format(a.holder, a.enter, a.exit, iv.holder, iv.enter, iv.exit)
          end
        end
      end
    end
    still[#still + 1] = iv
    active = still
  end
  return count, examples
end

--- A semaphore's history: the most holders at once, and the moments (an
-- enter) at which more than limit held. An exit and an enter at the same
-- microsecond count as one after the other.
function M.holders(intervals, limit)
  local events = {}
  for _, iv in ipairs(intervals) do
    events[#events + 1] = { t = iv.enter, d = 1 }
    events[#events + 1] = { t = iv.exit, d = -1 }
  end
  table.sort(events, function(a, b) if a.t ~= b.t then return a.t < b.t end return a.d < b.d end)
  local now, most, over = 0, 0, 0
  for _, e in ipairs(events) do
    now = now + e.d
    if now > most then most = now end
    if e.d > 0 and now > limit then over = over + 1 end
  end
  return most, over
end

--- Check a history. log is a path (or the log text with opts.text = true);
-- opts.counter is the counter file path. Returns a table of counts.
function M.check(log, opts)
  opts = opts or {}
  local text = opts.text and log or (proc.read_file(log) or "")
  local intervals, unfinished, malformed = M.parse(text)
  local r = {
    acquisitions = #intervals,
    unfinished = unfinished,
    malformed = malformed,
  }
  if opts.limit then r.most, r.over_limit = M.holders(intervals, opts.limit) end
  r.overlaps, r.examples = M.overlaps(intervals)
  if opts.counter then
    r.counter = M.read_counter(opts.counter)
    r.lost_updates = r.acquisitions - r.counter
  end
  return r
end

return M
