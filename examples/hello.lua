-- examples/hello.lua — the smallest complete redlock program.
--
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit examples/hello.lua
--
-- Starts a throwaway 3-node cluster, takes a lock, shows that a second
-- attempt finds it busy (with per-node detail), releases it, runs a critical
-- section with with_lock, and stops the nodes whatever happens.

local redlock = require "redlock"
local devcluster = require "redlock.devcluster"

local cluster = devcluster.start { n = 3 }

local ok, err = pcall(function()
    local dlm = redlock.new { servers = cluster.urls, ttl = 5000 }

    local lock = assert(dlm:lock("hello", { wait = 2000 }))
    print(("locked %q: value %s, valid for %.0f ms"):format(lock.resource, lock.value, lock.validity))

    -- While we hold it, another attempt is refused; detail says what each node did.
    local none, why, detail = dlm:try_lock("hello")
    assert(none == nil)
    print("second try_lock: " .. why)
    for _, node in ipairs(detail) do
        print(("  %s: %s"):format(node.server, node.state))
    end

    assert(lock:extend(10000))
    print(("extended: %.0f ms left"):format(lock:remaining()))
    assert(lock:unlock())
    print("unlocked")

    -- with_lock always releases, and returns what the function returns.
    local sum = dlm:with_lock("hello", { wait = 2000 }, function(l, a, b)
        assert(l:valid())
        return a + b
    end, 20, 22)
    print("with_lock returned " .. tostring(sum))
    dlm:close()
end)

cluster:stop()
if not ok then
    io.stderr:write("hello: ", tostring(err), "\n")
    os.exit(1)
end
