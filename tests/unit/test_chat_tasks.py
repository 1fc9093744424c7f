"""The free-text tasks for a pretrained chat model: lenient answers, episodes, held-out splits."""
from __future__ import annotations

import pytest

from turnstream.actors.envs.tasks.answers import last_number
from turnstream.actors.envs.tasks.arithmetic import Arithmetic
from turnstream.actors.envs.tasks.guess_number import GuessNumber
from turnstream.actors.envs.tasks.math_tool import MathTool, parse_action


@pytest.mark.parametrize("reply, number", [
    ("12", 12), ("The answer is 12.", 12), ("7 + 5 = 12", 12), ("**12**", 12), ("Answer: -3", -3),
    ("I guess 15", 15), ("The answer is 1,200.", 1200), ("answer is 12, since 7 + 5 = 12 and 3 < 4", 12),
    ("twelve", None), ("", None), ("x2", None),
])
def test_last_number_reads_replies_as_a_user_would(reply, number):
    assert last_number(reply) == number


async def test_arithmetic_scores_the_stated_number_and_enumerates_its_questions():
    env = Arithmetic(digits=1, operators="+")
    assert env.num_tasks == 1000
    reset = await env.reset(seed=0, task=3)
    assert reset.prompt_key == "arithmetic/3" and reset.system and reset.observation.startswith("What is")
    a, b = (int(x) for x in reset.observation[len("What is "):-1].split(" + "))
    right = await env.step(f"The answer is {a + b}.")
    assert right.done and right.reward == 1.0 and right.info["success"]
    await env.reset(seed=0, task=3)
    wrong = await env.step(f"{a + b + 1}")
    assert wrong.done and wrong.reward == 0.0
    assert (await Arithmetic().reset(seed=5, task=3)).observation == (await Arithmetic().reset(seed=9, task=3)).observation


async def test_guess_number_tells_higher_or_lower_until_the_guesses_run_out():
    env = GuessNumber(high=20, max_guesses=3)
    reset = await env.reset(seed=0, task=11)  # the secret is 12
    assert "1 to 20" in reset.observation and reset.prompt_key == "guess_number/12"
    step = await env.step("My guess is 10.")
    assert (step.observation, step.reward, step.done) == ("Higher. 2 guesses left.", 0.0, False)
    step = await env.step("hmm")
    assert step.observation.startswith("That is not a number.") and not step.done
    step = await env.step("15")
    assert step.done and step.reward == 0.0 and not step.info["success"]
    await env.reset(seed=0, task=11)
    assert (await env.step("Lower")).observation.startswith("That is not a number")
    step = await env.step("12")
    assert step.done and step.reward == 1.0 and step.info == {"success": True, "guesses": 2}


async def test_math_tool_tells_a_chat_model_the_format_and_enumerates_problems_when_asked():
    env = MathTool(questions=50)
    assert env.num_tasks == 50 and MathTool().num_tasks is None
    one, again = await env.reset(seed=1, task=7), await env.reset(seed=2, task=7)
    assert one.observation == again.observation and "calc" in one.system
    assert MathTool(system="").system == "" and (await MathTool(system="").reset(seed=1)).system is None
    assert parse_action("The answer is 42.") == ("answer", "42")
    assert parse_action("answer: **42**") == ("answer", "42")


@pytest.mark.parametrize("reply, parsed", [
    ("92.", ("answer", "92")), ("**92**", ("answer", "92")), ("calc 12*34", ("call", "12*34")),
    ("75+64 = 149", ("call", "75+64")), ("Let me compute (3 + 4) * 5 first", ("call", "(3 + 4) * 5")),
    ("39 is the answer.", ("answer", "39")), ("No idea!", ("invalid", "No idea!")),
])
def test_math_tool_reads_a_chat_models_calls_and_answers(reply, parsed):
    assert parse_action(reply) == parsed


async def test_math_tool_problems_follow_its_operands_and_operators():
    env = MathTool(terms=[2], max_operand=9, operators="+", question="What is {expression}?")
    reset = await env.reset(seed=3)
    a, b = (int(x) for x in reset.observation[len("What is "):-1].split("+"))
    assert 2 <= a <= 9 and 2 <= b <= 9 and env.answer == a + b


async def test_arithmetic_with_attempts_says_higher_or_lower_until_they_run_out():
    env = Arithmetic(digits=1, operators="+", attempts=3)
    await env.reset(seed=0, task=3)
    answer = env.answer
    step = await env.step(f"It is {answer - 2}.")
    assert (step.observation, step.reward, step.done) == (f"No, the answer is higher than {answer - 2}. Try again.",
                                                          0.0, False)
    step = await env.step("I do not know")
    assert step.observation == "No number there. Try again." and not step.done
    step = await env.step(f"{answer}")
    assert step.done and step.reward == 1.0 and step.info == {"success": True, "attempts": 3}
    await env.reset(seed=0, task=3)
    for _ in range(2):
        assert not (await env.step(f"{answer + 1}")).done
    last = await env.step(f"{answer + 1}")
    assert last.done and last.reward == 0.0 and not last.info["success"]
