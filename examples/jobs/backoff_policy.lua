-- examples/jobs/backoff_policy.lua — a retry policy for `redlock exec --policy`.
--
--   redlock exec --policy examples/jobs/backoff_policy.lua deploy -- ./deploy.sh
--
-- A policy file returns a function(attempt, last_err) -> delay_ms, or nil to
-- give up. `attempt` counts the failed attempts so far (1, 2, ...); last_err
-- is the short word of the last failure ("busy", "unavailable", ...).
-- redlock.retry has ready-made ones: fixed, jitter, exponential, forever.

local retry = require("redlock").retry

-- Exponential backoff with full jitter, 20 ms doubling up to 2 s, 40 attempts.
local backoff = retry.exponential { base = 20, cap = 2000, attempts = 40 }

return function(attempt, last_err)
    if last_err == "unavailable" and attempt >= 5 then
        return nil -- the cluster itself is in trouble: give up early
    end
    return backoff(attempt, last_err)
end
