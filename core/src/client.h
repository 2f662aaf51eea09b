/* client.h — what the keeper (keeper.c) needs of an rl_client beyond
 * redlock.h: its engine, which keeps the locks, shared with the threads
 * that call rl_keeper_*. */
#ifndef RL_CLIENT_H
#define RL_CLIENT_H

#include "redlock.h"

/* The engine c drives. */
rl_engine *rl_client_engine(rl_client *c);

/* Share c's engine with other threads under a lock: the thread that drives
 * c holds it whenever it calls into c; c's loop calls unlock(arg) just
 * before it waits for I/O and lock(arg) just after, so that others may call
 * into the engine meanwhile (what they change is looked at before the next
 * wait, or when it ends). */
void rl_client_share(rl_client *c, void (*unlock)(void *), void (*lock)(void *), void *arg);

/* Drive c's loop while busy(engine) is above 0, at most ms milliseconds. */
void rl_client_run_while(rl_client *c, int (*busy)(const rl_engine *), int ms);

/* rl_client_free, with every wait before the close over by deadline_ms
 * (rl_now_ms's clock): a keeper's client, whose releases had their time. */
void rl_client_free_by(rl_client *c, double deadline_ms);

#endif
