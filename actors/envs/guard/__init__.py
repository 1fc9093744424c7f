"""Guarding the actor from its environments: time limits, loop-block detection and process isolation.

    settings   GuardSettings: the run's limits and isolation ([env]), and which limit applies to a call
    timed      Timed: runs an environment's coroutine, timing each stretch it holds the event loop
    watchdog   LoopWatchdog: a thread that notices a stretch past its call's time limit while it holds the loop
    guarded    GuardedEnvironment: the one wrapper every episode's environment is played through
    hosts      EnvHost: where environments are made (on the actor's loop, or in worker processes)
    pool       WorkerPool: the actor's worker processes (each with its process group), replaced when they die, hang
               or outgrow memory
    remote     WorkerEnvironment: an environment in a worker, as the actor sees it
    wire       the request/reply frames between the actor and a worker (msgpack over a socket pair)
    worker     the worker process (`python -m turnstream.actors.envs.guard.worker`); never imports torch
"""
