"""Playing episodes. `runner` runs the actor's episode slots (credit, task, play, delivered); `player` is the
interface of how one episode is played, chosen once at start-up by `choose`:

    env_loop    EnvironmentLoop: reset and step an Environment, sampling each reply (most environments)
    agent       AgentPlayer: a user's agent function over the OpenAI client (`env.name = "agent"`)
    verifiers/  VerifiersPlayer: a verifiers rollout in a harness worker (`env.name = "verifiers"`)

`context` is what every player works with (chat tokens, clients, sampling, link, metrics) and turns a turn
into a chunk; `stream` is one agent's side of an episode; `episode_figures` the numbers an environment reported
about an episode (its last `Step.info`); `endpoint/` is the OpenAI-compatible endpoint
whose chat calls are the turns of the agent and verifiers episodes."""
