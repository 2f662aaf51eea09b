-- Spec helper for spec/sanitizers/*_asan.lua: running a process with the
-- ASan runtime preloaded, so that it can load build-asan/redlock_core.so.
--
--   local asan = require "helpers.asan"
--   local env = asan.env(dir)   -- LD_PRELOAD, ASAN_OPTIONS, UBSAN_OPTIONS (reports into dir)
--   asan.reports(dir)           -- every report written there, "" for none
--   asan.nodes(setup, teardown, state, stop)  -- in a describe: 3 nodes (state.cl) and a
--                                             -- report dir (state.dir), gone afterwards

local proc = require "helpers.proc"
local cluster = require "helpers.cluster"

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

--- Register, with busted's setup and teardown, three nodes (state.cl) and a
--- directory for reports (state.dir) for a describe block of a spec run on
--- build-asan; stop (optional) runs first at the teardown.
function M.nodes(setup, teardown, state, stop)
  setup(function()
    assert(proc.build:match("asan"), "run with REDLOCK_BUILD_DIR=build-asan, not " .. proc.build)
    state.cl = cluster.start(3)
    state.dir = proc.tmpdir()
  end)
  teardown(function()
    if stop then stop() end
    cluster.stop_all()
    if state.dir then proc.rmdir(state.dir) end
  end)
end

return M
