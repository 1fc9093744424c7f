"""Rollout actor role: play episodes against environments with vLLM and stream every turn.

    main.py         the actor process (`turnstream actor`)
    play/           playing episodes: the slots, the episode players, the OpenAI-compatible endpoint
    envs/           environments: their names (registry.py: built-ins, then entry points), shipped tasks, test
                    probes, remote (HTTP), library adapters
    environment.py  the Environment interface
    inference/      sampling from vLLM: one request, the fleet of servers, chat-template tokens
    tasks/          which task each episode plays: orders, groups, SPO's curriculum, position, held-out split
    evaluation.py   rounds of held-out episodes, never streamed
    link.py         the connection to the buffer: credits in, chunks out
    drain.py        the graceful stop; loop_shared.py objects shared per event loop; metrics.py
"""
