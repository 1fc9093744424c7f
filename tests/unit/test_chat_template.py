"""The actor renders turns with the model's own chat template (actors/inference/chat_tokens.py)."""
from __future__ import annotations

import json
import shutil

import pytest

from turnstream.actors.inference.chat_tokens import ChatTokens

# SmolLM2-Instruct's template: ChatML, with a default system turn when the conversation opens without one
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _with_template(tiny_model, tmp_path, template: str, *, separate_file: bool):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    if separate_file:  # where transformers 5 writes it
        (folder / "chat_template.jinja").write_text(template)
    else:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_tiny_model_turns_are_plain_chatml(tiny_model):
    """The tiny model's template is bare ChatML: the turns are exactly what every recorded run was built from."""
    chat = ChatTokens(tiny_model)
    assert chat.first_turn("pos 3") == chat.encode("<|im_start|>user\npos 3<|im_end|>\n<|im_start|>assistant\n")
    reply = chat.encode("L")
    assert chat.next_turn("pos 4", reply) == chat.encode(
        "<|im_end|>\n<|im_start|>user\npos 4<|im_end|>\n<|im_start|>assistant\n")
    assert chat.next_turn("pos 4", reply + [chat.end_of_turn_id]) == chat.encode(
        "\n<|im_start|>user\npos 4<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("separate_file", [False, True])
def test_default_system_turn_comes_from_the_template(tiny_model, tmp_path, separate_file):
    chat = ChatTokens(_with_template(tiny_model, tmp_path, SMOLLM2_TEMPLATE, separate_file=separate_file))
    assert chat.decode(chat.first_turn("hi")) == chat.decode(chat.encode(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"))
    own = chat.first_turn("hi", system="Answer with a number.")
    assert chat.encode("<|im_start|>system\nAnswer with a number.<|im_end|>\n")[:3] == own[:3]
    assert "SmolLM" not in chat.decode(own)


def test_multi_turn_context_is_the_template_rendering_of_the_conversation(tiny_model, tmp_path):
    """first_turn + reply + eot + next_turn + ... is, token for token, the template's rendering of the whole
    conversation, each reply tokenized as generated and closed by the end-of-turn token the model stopped on."""
    chat = ChatTokens(_with_template(tiny_model, tmp_path, SMOLLM2_TEMPLATE, separate_file=True))
    users, replies = ["guess 1 to 20", "Higher. 4 guesses left.", "Lower. 3 guesses left."], ["10", "15", "12"]
    context = chat.first_turn(users[0], system="Reply with one number.")
    for reply, user in zip(replies, users[1:]):
        generated = chat.encode(reply) + [chat.end_of_turn_id]
        context += generated + chat.next_turn(user, generated)
    messages = [{"role": "system", "content": "Reply with one number."}]
    for user, reply in zip(users, replies):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    rendered = chat.render(messages[:-1], add_generation_prompt=True)
    assert context == chat.encode(rendered)


def test_a_reply_cut_off_before_its_end_of_turn_is_closed_by_the_delta(tiny_model, tmp_path):
    chat = ChatTokens(_with_template(tiny_model, tmp_path, SMOLLM2_TEMPLATE, separate_file=True))
    delta = chat.decode(chat.next_turn("again", chat.encode("1")))
    assert delta.startswith("\n") and chat.next_turn("again", chat.encode("1"))[0] == chat.end_of_turn_id


def test_a_model_without_a_chat_template_is_refused(tiny_model, tmp_path):
    folder = _with_template(tiny_model, tmp_path, "", separate_file=True)
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="no chat template"):
        ChatTokens(folder)
