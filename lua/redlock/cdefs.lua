-- redlock.cdefs: the FFI declarations of core/include/redlock.h, in one place,
-- and the loader of the C core. spec/cdefs_spec.lua checks that the two agree.
--
-- The core is looked up first in the running executable (the `redlock` host
-- links it in and exports its symbols), then as redlock_core.so along
-- package.cpath. On failure the error lists every path that was tried.

local ffi = require "ffi"

local _M = {}

-- #define constants of the header, as enum constants usable in array sizes.
_M.source = [[
enum {
    RL_OK = 0,
    RL_ERR = -1,
    RL_ERR_FULL = -2,
    RL_ERR_LEN = 256,
    RL_MAX_NODES = 16,
    RL_MAX_SHARDS = 48,
    RL_MAX_LINKS = 128,
    RL_VALUE_LEN = 40,
    RL_NODE_ERR_LEN = 96,
    RL_ID_SLOTS = 65536,
    RL_WAITER_ID_LEN = 16,
    RL_MAX_LIMIT = 1024,
    RL_MAX_SLOT_KEYS = 1048576,
    RL_LABEL_MAX = 15,
    RL_MAX_REPLICAS = 64,
    RL_STATS_KINDS = 7,
    RL_STATS_OUTCOMES = 6,
    RL_STATS_STATES = 5,
    RL_STATS_BUCKETS = 14,
    RL_MAX_KEY_LEN = 65536
};

enum {
    RL_OP_ACQUIRE = 1,
    RL_OP_RELEASE = 2,
    RL_OP_EXTEND = 3
};

enum {
    RL_STATUS_PENDING = 0,
    RL_STATUS_OK = 1,
    RL_STATUS_BUSY = 2,
    RL_STATUS_UNAVAILABLE = 3,
    RL_STATUS_TIMEOUT = 4,
    RL_STATUS_NOT_HELD = 5
};

enum {
    RL_NODE_PENDING = 0,
    RL_NODE_OK = 1,
    RL_NODE_TAKEN = 2,
    RL_NODE_ERROR = 3,
    RL_NODE_TIMEOUT = 4
};

typedef struct rl_tls_options {
    const char *cafile;
    const char *capath;
    const char *certfile;
    const char *keyfile;
    const char *server_name;
    int verify;
} rl_tls_options;

int rl_tls_check(const rl_tls_options *tls, char *err, size_t errlen);

typedef struct rl_options {
    int node_timeout_ms;
    int connect_timeout_ms;
    int reconnect_min_ms;
    int reconnect_max_ms;
    int stall_reset_ms;
    int quorum;
    double drift_factor;
    const char *prefix;
    size_t prefix_len;
    rl_tls_options tls;
    const char *label;
    int no_stats;
    int replicas;
} rl_options;

typedef struct rl_node_result {
    int state;
    char errstr[RL_NODE_ERR_LEN];
} rl_node_result;

typedef struct rl_result {
    int id;
    int op;
    int status;
    int nodes;
    int quorum;
    int ok;
    int taken;
    int failed;
    double elapsed_ms;
    double validity_ms;
    long long token;
    int heard;
    int slot;
    char value[RL_VALUE_LEN + 1];
    rl_node_result node[RL_MAX_NODES];
} rl_result;

typedef struct rl_client rl_client;

void rl_options_init(rl_options *opts);
rl_client *rl_client_new(const char *const *urls, int nurls, const rl_options *opts, char *err, size_t errlen);
void rl_client_free(rl_client *c);
void rl_client_close(rl_client *c);
int rl_client_nodes(const rl_client *c);
const char *rl_client_node_name(const rl_client *c, int i);
int rl_client_quorum(const rl_client *c);
const char *rl_client_errstr(const rl_client *c);
int rl_begin_acquire(rl_client *c, const char *resource, size_t len, int ttl_ms);
const char *rl_reserved_key(const char *prefix, size_t prefix_len, const char *resource, size_t len);
int rl_begin_release(rl_client *c, const char *resource, size_t len, const char *value);
int rl_begin_release_quiet(rl_client *c, const char *resource, size_t len, const char *value);
int rl_begin_extend(rl_client *c, const char *resource, size_t len, const char *value, int ttl_ms);
int rl_begin_acquire_fenced(rl_client *c, const char *resource, size_t len, int ttl_ms);
int rl_begin_acquire_queued(rl_client *c, const char *resource, size_t len, int ttl_ms);
int rl_begin_acquire_slot(rl_client *c, const char *resource, size_t len, int limit, int ttl_ms, double ticket);
int rl_begin_on_slot(rl_client *c, int kind, const char *resource, size_t len, int slot, const char *value,
                     int ttl_ms);
int rl_begin_acquire_shared(rl_client *c, const char *resource, size_t len, int ttl_ms);
int rl_run(rl_client *c, int timeout_ms);
int rl_run_until(rl_client *c, double deadline_ms);
int rl_collect(rl_client *c, rl_result *out);
int rl_wait(rl_client *c, int id, rl_result *out);
void rl_sleep(rl_client *c, int ms);
int rl_acquire(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out);
int rl_acquire_fenced(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out);
int rl_acquire_queued(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out);
int rl_acquire_shared(rl_client *c, const char *resource, size_t len, int ttl_ms, rl_result *out);
int rl_release(rl_client *c, const char *resource, size_t len, const char *value, rl_result *out);
int rl_extend(rl_client *c, const char *resource, size_t len, const char *value, int ttl_ms, rl_result *out);
int rl_acquire_slot(rl_client *c, const char *resource, size_t len, int limit, int ttl_ms, double ticket,
                    rl_result *out);
int rl_on_slot(rl_client *c, int kind, const char *resource, size_t len, int slot, const char *value, int ttl_ms,
               rl_result *out);
int rl_watch(rl_client *c, const char *resource, size_t len);
void rl_unwatch(rl_client *c, const char *resource, size_t len);
void rl_unwatch_won(rl_client *c, const char *resource, size_t len);
unsigned rl_heard(const rl_client *c, const char *resource, size_t len);
int rl_heard_listeners(const rl_client *c, const char *resource, size_t len);
int rl_sleep_until(rl_client *c, const char *resource, size_t len, unsigned heard, int ms);
int rl_client_listening(const rl_client *c);

typedef struct rl_engine rl_engine;

enum {
    RL_WANT_WRITE = 1,
    RL_WANT_CONNECT = 2,
    RL_WANT_CLOSE = 4
};

rl_engine *rl_engine_new(const char *const *urls, int nurls, const rl_options *opts, char *err, size_t errlen);
void rl_engine_free(rl_engine *e);
int rl_engine_nodes(const rl_engine *e);
const char *rl_engine_node_name(const rl_engine *e, int i);
const char *rl_engine_node_host(const rl_engine *e, int i);
int rl_engine_node_port(const rl_engine *e, int i);
int rl_engine_node_tls(const rl_engine *e, int i);
const char *rl_engine_node_tls_name(const rl_engine *e, int i);
int rl_engine_quorum(const rl_engine *e);
const char *rl_engine_waiter_id(const rl_engine *e);
const char *rl_engine_errstr(const rl_engine *e);
int rl_engine_begin_acquire(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms);
int rl_engine_begin_acquire_fenced(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms);
int rl_engine_begin_acquire_queued(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms);
int rl_engine_begin_acquire_shared(rl_engine *e, const char *resource, size_t len, int ttl_ms, double now_ms);
int rl_engine_begin_release(rl_engine *e, const char *resource, size_t len, const char *value, double now_ms);
int rl_engine_begin_release_quiet(rl_engine *e, const char *resource, size_t len, const char *value, double now_ms);
int rl_engine_begin_acquire_slot(rl_engine *e, const char *resource, size_t len, int limit, int ttl_ms,
                                 double ticket, double now_ms);
int rl_engine_begin_on_slot(rl_engine *e, int kind, const char *resource, size_t len, int slot, const char *value,
                            int ttl_ms, double now_ms);
int rl_engine_begin_extend(rl_engine *e, const char *resource, size_t len, const char *value, int ttl_ms, double now_ms);
unsigned rl_engine_wanting(const rl_engine *e);
int rl_engine_links(const rl_engine *e);
int rl_engine_next_wanting(const rl_engine *e, int after);
int rl_engine_node_wants(rl_engine *e, int node);
void rl_engine_node_open(rl_engine *e, int node, double now_ms);
int rl_engine_node_connected(rl_engine *e, int node, int fresh, double now_ms);
void rl_engine_node_handshaking(rl_engine *e, int node);
void rl_engine_node_down(rl_engine *e, int node, const char *why, double now_ms);
void rl_engine_node_closed_unused(rl_engine *e, int node, const char *why, double now_ms);
int rl_engine_node_detach(rl_engine *e, int node, double now_ms);
size_t rl_engine_node_output(rl_engine *e, int node, const char **data);
void rl_engine_node_wrote(rl_engine *e, int node, size_t n, double now_ms);
int rl_engine_node_feed(rl_engine *e, int node, const char *data, size_t len, double now_ms);
void rl_engine_node_unsent(rl_engine *e, int node, long long bytes);
void rl_engine_untimed_reads(rl_engine *e, int on);
unsigned rl_engine_suspects_due(rl_engine *e, double now_ms);
int rl_engine_node_unanswered(const rl_engine *e, int node);
const char *rl_engine_node_errstr(const rl_engine *e, int node);
int rl_engine_watch(rl_engine *e, const char *resource, size_t len, double now_ms);
void rl_engine_unwatch(rl_engine *e, const char *resource, size_t len, double now_ms);
void rl_engine_unwatch_won(rl_engine *e, const char *resource, size_t len, double now_ms);
unsigned rl_engine_heard(const rl_engine *e, const char *resource, size_t len);
int rl_engine_heard_listeners(const rl_engine *e, const char *resource, size_t len);
int rl_engine_listening(const rl_engine *e);
int rl_engine_heard_next(rl_engine *e, int *broadcast);
double rl_engine_deadline(const rl_engine *e);
void rl_engine_advance(rl_engine *e, double now_ms);
int rl_engine_collect(rl_engine *e, rl_result *out);
int rl_engine_take(rl_engine *e, int id, rl_result *out);
int rl_engine_done(const rl_engine *e);
int rl_engine_inflight(const rl_engine *e);
int rl_engine_tails(const rl_engine *e);
int rl_engine_unwritten(const rl_engine *e);
int rl_engine_unanswered(const rl_engine *e);
void rl_engine_abandon(rl_engine *e, double now_ms);
int rl_engine_finished(const rl_engine *e, int id);
int rl_engine_first_done(const rl_engine *e);
int rl_engine_cleanup_unwritten(rl_engine *e, int id);
double rl_engine_held_until(const rl_engine *e, int id);

enum {
    RL_KEEP_HELD = 1,
    RL_KEEP_LOST = 2,
    RL_KEEP_RELEASED = 3
};
int rl_engine_keep_add(rl_engine *e, const char *resource, size_t len, const char *value, int ttl_ms,
                       double valid_until_ms, int margin_ms, double now_ms);
int rl_engine_keep_add_slot(rl_engine *e, const char *resource, size_t len, int slot, const char *value, int ttl_ms,
                            double valid_until_ms, int margin_ms, double now_ms);
int rl_engine_keep_state(rl_engine *e, int id, double *valid_until_ms, double now_ms);
int rl_engine_keep_update(rl_engine *e, int id, int ttl_ms, double started_ms, double valid_until_ms, double now_ms);
int rl_engine_keep_remove(rl_engine *e, int id);
int rl_engine_keep_drop(rl_engine *e, int id, double now_ms);
int rl_engine_keep_lapse(rl_engine *e, int id);
int rl_engine_keep_release_all(rl_engine *e, double now_ms);
int rl_engine_keep_releasing(const rl_engine *e, int *released);
int rl_engine_keeping(const rl_engine *e);
void rl_engine_keep_clear(rl_engine *e);

typedef struct rl_keeper rl_keeper;
rl_keeper *rl_keeper_new(const char *const *urls, int nurls, const rl_options *opts, char *err, size_t errlen);
void rl_keeper_free(rl_keeper *k);
void rl_keeper_close(rl_keeper *k);
int rl_keeper_add(rl_keeper *k, const char *resource, size_t len, const char *value, int ttl_ms,
                  double valid_until_ms, int margin_ms, char *err, size_t errlen);
int rl_keeper_add_slot(rl_keeper *k, const char *resource, size_t len, int slot, const char *value,
                       int ttl_ms, double valid_until_ms, int margin_ms, char *err, size_t errlen);
int rl_keeper_state(rl_keeper *k, int id, double *valid_until_ms);
int rl_keeper_update(rl_keeper *k, int id, int ttl_ms, double started_ms, double valid_until_ms);
int rl_keeper_remove(rl_keeper *k, int id);
int rl_keeper_drop(rl_keeper *k, int id);
int rl_keeper_release(rl_keeper *k, int timeout_ms);
int rl_keeper_release_all(int timeout_ms);

typedef struct rl_histogram {
    unsigned long long count[RL_STATS_BUCKETS];
    double sum_ms;
} rl_histogram;

typedef struct rl_node_stats {
    unsigned long long votes[RL_STATS_STATES];
    unsigned long long timeouts;
    unsigned long long connects;
    unsigned long long reconnects;
    unsigned long long resets;
    unsigned long long lost;
    unsigned long long step_checks;
    unsigned long long suspected;
    rl_histogram reply;
    unsigned long long moved;
    unsigned long long ask;
    unsigned long long tryagain;
    int up;
    int suspect;
} rl_node_stats;

typedef struct rl_stats {
    int nodes;
    unsigned long long ops[RL_STATS_KINDS][RL_STATS_OUTCOMES];
    rl_histogram decision[RL_STATS_KINDS];
    unsigned long long tails;
    unsigned long long cleanups;
    unsigned long long wakeups;
    unsigned long long keep_extends[RL_STATS_OUTCOMES];
    unsigned long long keep_releases[RL_STATS_OUTCOMES];
    unsigned long long locks_lost;
    int inflight;
    int tails_running;
    int waiters;
    int kept;
    rl_node_stats node[RL_MAX_NODES];
} rl_stats;

void rl_engine_stats(const rl_engine *e, rl_stats *out);
void rl_client_stats(const rl_client *c, rl_stats *out);
void rl_keeper_stats(rl_keeper *k, rl_stats *out);
double rl_stats_bucket_ms(int i);
const char *rl_stats_kind_word(int kind);

double rl_now_ms(void);
double rl_wall_ms(void);
double rl_random(void);
const char *rl_status_word(int status);
const char *rl_node_state_word(int state);
const char *rl_version(void);
]]

ffi.cdef(_M.source)

-- What a transport's call returns, beside the core's RL_OK, RL_ERR and
-- RL_ERR_FULL (0, -1, -2), when it could not reach its engine (inside
-- nginx: the hub's timer could not start, or no result came from it in
-- time): nothing the caller did wrong (redlock.batch turns it into a round
-- no node answered).
_M.UNREACHABLE = -3

local function in_executable()
    local ok = pcall(function() return ffi.C.rl_version end)
    return ok and ffi.C or nil
end

-- Walk package.cpath for redlock_core.so; return the loaded library and its
-- path, or nil and the list of paths tried.
local function from_cpath()
    local tried = {}
    for template in package.cpath:gmatch("[^;]+") do
        local path = template:gsub("%?", "redlock_core")
        local f = io.open(path, "rb")
        if f then
            f:close()
            local ok, lib = pcall(ffi.load, path)
            if ok then return lib, path end
            tried[#tried + 1] = path .. " (" .. tostring(lib) .. ")"
        else
            tried[#tried + 1] = path
        end
    end
    return nil, tried
end

local function load()
    local exe = in_executable()
    if exe then return exe, "(executable)" end
    local lib, where = from_cpath()
    if lib then return lib, where end
    error("redlock: cannot find the C core redlock_core.so; tried:\n\t" .. table.concat(where, "\n\t"), 3)
end

_M.lib, _M.path = load()

return _M
