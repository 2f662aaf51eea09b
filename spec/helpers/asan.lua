-- Spec helper for spec/sanitizers/*_asan.lua: running a process with the
-- ASan runtime preloaded, so that it can load build-asan/redlock_core.so.
--
--   local asan = require "helpers.asan"
--   local env = asan.env(dir)   -- LD_PRELOAD, ASAN_OPTIONS, UBSAN_OPTIONS (reports into dir)
--   asan.reports(dir)           -- every report written there, "" for none

local proc = require "helpers.proc"

local M = {}

-- The ASan runtime the compiler links against (gcc or clang, as cmake used).
function M.libasan()
  for _, cc in ipairs { "gcc", "clang", "clang-14" } do
    local out, rc = proc.sh(cc .. " -print-file-name=libasan.so 2>/dev/null")
    local path = rc == 0 and out and out:match("^%s*(.-)%s*$")
    if path and path:sub(1, 1) == "/" and io.open(path, "rb") then return path end
  end
  error("no libasan.so found (gcc -print-file-name=libasan.so)")
end

--- The environment of a process whose reports go to files in dir.
function M.env(dir)
  return {
    LD_PRELOAD = M.libasan(),
    ASAN_OPTIONS = "detect_leaks=0:abort_on_error=0:log_path=" .. dir .. "/asan",
    UBSAN_OPTIONS = "print_stacktrace=1:log_path=" .. dir .. "/ubsan",
  }
end

--- Every report the runtimes wrote into dir (asan.<pid>, ubsan.<pid>),
--- concatenated; "" when there is none.
function M.reports(dir)
  local q = proc.quote(dir)
  return (proc.sh("cat " .. q .. "/asan.* " .. q .. "/ubsan.* 2>/dev/null"))
end

return M
