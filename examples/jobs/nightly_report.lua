-- examples/jobs/nightly_report.lua — a job that must run on one machine at a time.
--
--   export REDLOCK_SERVERS=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379
--   redlock run examples/jobs/nightly_report.lua [DAY]
--
-- Run it from cron on every machine: one of them does the work, the others
-- find the lock held and exit 0 without doing anything. The lock is kept
-- alive by a C thread while the job runs, however long its steps take, and
-- released however the script ends (error, os.exit, Ctrl-C, SIGTERM).

local redlock = require "redlock"

local day = arg[1] or os.date("%Y-%m-%d")
local dlm = redlock.default() -- the servers from --servers / REDLOCK_SERVERS

local ok, err = dlm:with_lock("report:" .. day, { ttl = 15000, wait = 0 }, function(lock)
    print(("building the report for %s (lock value %s...)"):format(day, lock.value:sub(1, 8)))
    for step = 1, 3 do
        os.execute("sleep 1")   -- stands for real work: a query, a file transfer...
        lock:check()            -- raises "lost: ..." if the lock was lost meanwhile
        print(("  step %d done, %d ms of validity left"):format(step, lock:remaining()))
    end
    return true
end)

if not ok then
    if err == "busy" then
        print("another machine is building the report for " .. day)
        return 0
    end
    error("could not lock: " .. tostring(err))
end
print("report for " .. day .. " done")
