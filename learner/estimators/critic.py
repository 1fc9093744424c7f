"""Value functions for turn_gae / token_gae: a head on the policy's backbone, or a separate critic model.

V(s_t) for the state before token p is read at position p - 1, whose hidden state has seen exactly the
context before p (the same alignment as the logits that predict p).
"""
from __future__ import annotations

import torch
from torch import nn

from turnstream.learner.batch.forward import MicroBatch, action_logits


class ValueHead(nn.Module):
    """Linear read-out of the last hidden state; zero-initialised so early values do not swamp GAE."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden_states.float()).squeeze(-1)


class SeparateCritic(nn.Module):
    """Its own backbone (any HF causal LM checkpoint) plus a value head; trained with its own optimizer."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = ValueHead(backbone.config.hidden_size)
        lm_head = backbone.get_output_embeddings()
        if lm_head is not None and lm_head.weight is not backbone.get_input_embeddings().weight:
            # values never read the LM head: no gradient, no optimizer state, and data parallel (which
            # expects a gradient for every trainable parameter) does not wait for one
            lm_head.requires_grad_(False)

    def forward(self, **inputs) -> torch.Tensor:
        out = self.backbone(**inputs, output_hidden_states=True, logits_to_keep=1)  # values need no logits
        return self.head(out.hidden_states[-1])


class PolicyAndValue(nn.Module):
    """One call gives the policy's logits and, if a critic is configured, values at every position.

    A module (not a plain holder) so that data parallel can wrap policy and critic as one network.
    """

    def __init__(self, model: nn.Module, mode: str | None, critic_path: str = ""):
        super().__init__()
        self.model = model
        self.mode = mode  # None: no critic
        self.head: ValueHead | None = None
        self.critic: SeparateCritic | None = None
        if mode == "shared":
            self.head = ValueHead(model.config.hidden_size)
        elif mode == "separate":
            from transformers import AutoModelForCausalLM

            self.critic = SeparateCritic(AutoModelForCausalLM.from_pretrained(critic_path, dtype=torch.float32))

    def forward(self, mb: MicroBatch, values_only: bool = False) -> tuple[torch.Tensor | None, ...]:
        """Logits [n, V] and values [n] at the micro-batch's action positions (learner/batch/forward.py), and
        values [k] at its truncated episodes' cuts (mb.cut_rows); values are None without a critic.

        values_only: no logits, and values whose gradient reaches the critic's parameters alone (episodes served
        to the critic alone): the shared backbone runs without gradients, so only the value head learns."""
        if values_only:
            return (None, *self._values_alone(mb))
        if self.mode == "shared":
            out = action_logits(self.model, mb, output_hidden_states=True)
            return (out.logits, *self._read(mb, self.head, out.hidden_states[-1]))
        logits = action_logits(self.model, mb).logits
        if self.critic is None:
            return logits, None, None
        return (logits, *self._read(mb, lambda v: v, self.critic(**mb.inputs())))

    def _values_alone(self, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mode == "shared":
            with torch.no_grad():
                out = self.model(**mb.inputs(), output_hidden_states=True, logits_to_keep=1)
            return self._read(mb, self.head, out.hidden_states[-1])
        return self._read(mb, lambda v: v, self.critic(**mb.inputs()))

    @staticmethod
    def _read(mb: MicroBatch, head, per_position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`head` of the per-position outputs at the actions and at the cuts."""
        return head(mb.at_actions(per_position)), head(mb.at_cuts(per_position))

    def critic_parameters(self) -> list[nn.Parameter]:
        if self.head is not None:
            return list(self.head.parameters())
        return [p for p in self.critic.parameters() if p.requires_grad] if self.critic is not None else []

    def critic_module(self) -> nn.Module | None:
        """The value head or the separate critic, whichever trains (None without a critic)."""
        return self.head if self.head is not None else self.critic

    def critic_state_dict(self) -> dict:
        module = self.critic_module()
        return module.state_dict() if module is not None else {}

    def load_critic_state_dict(self, state: dict) -> None:
        module = self.critic_module()
        if module is not None and state:
            module.load_state_dict(state)
