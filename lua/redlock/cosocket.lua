-- redlock.cosocket: the transport inside nginx. The C core's engine
-- (rl_engine_*: the whole algorithm, no I/O, no clock) driven over
-- ngx.socket.tcp, so a lock call yields to nginx's event loop instead of
-- blocking the worker. Nothing of the algorithm is here: these modules
-- move bytes, read the clock and sleep.
--
-- One driver per worker and configuration: the hub. A hub owns one engine
-- and its links (per node a command connection and, once something is
-- watched, a subscriber connection: redlock.h, "Links"), and runs in a
-- long-lived ngx.timer callback (a timer is a request of its own, so its
-- cosockets live as long as it runs). In it, one light thread per link
-- connects and reads, feeding what arrives to the engine; the timer's main
-- loop waits on a semaphore ("work posted") or until the engine's next
-- deadline, then does what the engine wants (close, connect, write),
-- advances it, and hands every finished result to the request waiting for
-- it. Everything begun since the last turn goes to each node in one send:
-- that is where the throughput comes from.
--
-- A lock call never touches a socket: it begins its operation on the hub's
-- engine (pure C), posts the hub's semaphore and waits on a semaphore of its
-- own for the result. Replies cannot cross requests: requests own no
-- sockets, and the engine pairs every reply with its command.
--
-- Clients made with the same servers and options (passwords included) share
-- the worker's hub: a client made per request costs no connection. The hub
-- starts with the first call; with nothing in flight, no tail and no call
-- for HUB_IDLE_MS it ends its timer and closes its connections (the next
-- call starts it again); when the worker exits it serves the operations
-- begun until decided, tails for at most a node timeout, and kept locks for
-- as long as they are kept, then stops. client:free() never stops a hub. It
-- also extends the worker's kept locks (see "kept locks").
-- rediss:// nodes: the connections speak TLS.
--
-- The modules, one concern each, under redlock/nginx/:
--   calls.lua    the calls' side: phases with cosockets, starting and waking
--                the hub, waiters, delivering results, calls that are gone
--   hub.lua      the hub: its state, its timer's loop and lifecycle, the
--                worker's hubs by configuration
--   links.lua    the hub's connections: a light thread per link, service
--                (close, connect, write as the engine asks)
--   tls.lua      TLS on cosockets: settings, client certificate, the handshake
--   keep.lua     kept locks (the engine's keep-alive) and the keeper object
--   watch.lua    hand-off (the engine's subscriptions): waking sleepers
--   client.lua   the client object of the contract (backend.lua)
--   metrics.lua  every worker's counts summed through a shared dict, for /metrics
-- This module is the transport's entry (backend.lua requires it).

local calls = require "redlock.nginx.calls"
local client = require "redlock.nginx.client"
local keep = require "redlock.nginx.keep"

return {
    name = "cosocket",
    handoff = true, -- waiters wake on a heard release (client:watch, client:sleep_until)
                    -- and queue (client:acquire_queued), to be woken alone
    client_new = client.client_new,
    keeper_new = keep.keeper_new,
    phase_refusal = calls.phase_refusal,
}
