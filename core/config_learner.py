"""The [learner] table and its [learner.spo], [learner.critic], [learner.gigpo] and [learner.mars] subtables."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from turnstream.core.config_fields import CpuIds, Port, PositiveOrAuto, Section
from turnstream.core.config_lora import LoraSection
from turnstream.core.configtools import require


# the estimators that read a value function: the config checks them here, below the learner, and
# tests/unit/test_estimator_registry.py holds them equal to the learner's estimators whose needs_critic is true
CRITIC_ESTIMATORS = ("turn_gae", "token_gae", "turn_td")

# "auto": the learner chooses the value from the size of the policy it trains (learner/scale_defaults.py)
NonNegativeOrAuto = Annotated[float, Field(ge=0)] | Literal["auto"]
StepsOrAuto = Annotated[int, Field(ge=0)] | Literal["auto"]
TokensOrAuto = Annotated[int, Field(ge=0)] | Literal["auto"]
PRETRAINED_SCALE = 10_000_000  # parameters from which a policy is taken to be a pretrained language model
LARGE_SCALE = 1_000_000_000  # parameters from which the peer systems' recipes for billion-scale LLMs apply
# the [learner] keys that may be "auto"
AUTO_SETTINGS = ("lr", "warmup_steps", "entropy_coef", "critic.lr", "max_tokens_per_microbatch")


@dataclass(frozen=True)
class ScaleDefaults:
    """The values of AUTO_SETTINGS for one kind of policy."""

    lr: float
    warmup_steps: int
    entropy_coef: float
    critic_lr: float
    max_tokens_per_microbatch: int  # 0: no budget

    def value(self, setting: str) -> float | int:
        return getattr(self, setting.replace(".", "_"))


# The micro-batch budget bounds the activations one forward/backward holds, which grow as hidden size x layers x
# tokens. The tiny model needs no bound on memory, but a budget still sorts its padded rows by length: a whole
# batch in one micro-batch pads every episode to the batch's longest, which on a long tail of episode lengths
# trains several times the batch's tokens (`turnstream bench learner --long-tail`). A whole batch in one forward
# ran SmolLM2-135M (576 wide, 30 layers) out of memory; it learns in micro-batches of 2048 tokens. The smallest
# billion-scale models have about twice its hidden size x layers (Llama-3.2-1B: 2048 x 16), so half the tokens hold
# as much. Larger models train on GPUs, whose bf16 autocast about halves the activations. An auto budget is never
# below vllm.max_model_len (learner/scale_defaults.py resolve): an episode longer than the budget would be dropped.

# measured on the tiny model (BENCHMARKS.md, "The learner learns", "From a model that can read")
TINY = ScaleDefaults(lr=1e-3, warmup_steps=0, entropy_coef=0.2, critic_lr=1e-3, max_tokens_per_microbatch=4096)
# a small pretrained chat model (SmolLM2-135M-Instruct), measured on its tasks (BENCHMARKS.md, "A real language
# model"): the billion-scale recipes' 1e-6 did not move its success in 25 steps; with LoRA, 2e-4 moved the policy
# 10-50 times less a step than full fine-tuning at 2e-5 and did not learn in 9 steps, 1e-3 learnt in 5 but moved
# the policy past a step_kl of 0.05 and lost what it had learnt in one seed of three, 5e-4 learnt in all three
SMALL_PRETRAINED = ScaleDefaults(lr=2e-5, warmup_steps=0, entropy_coef=0.0, critic_lr=2e-5,
                                 max_tokens_per_microbatch=2048)
SMALL_PRETRAINED_LORA = ScaleDefaults(lr=5e-4, warmup_steps=0, entropy_coef=0.0, critic_lr=2e-5,
                                      max_tokens_per_microbatch=2048)
# the rates of the peer systems' recipes for a billion-scale pretrained LLM (TRL's GRPOConfig, veRL's actor and
# critic), the budget scaled from SmolLM2-135M's as above; not measured here
PRETRAINED = ScaleDefaults(lr=1e-6, warmup_steps=10, entropy_coef=0.0, critic_lr=1e-5, max_tokens_per_microbatch=1024)
PRETRAINED_LORA = ScaleDefaults(lr=1e-5, warmup_steps=10, entropy_coef=0.0, critic_lr=1e-5,
                                max_tokens_per_microbatch=1024)
_PEER_RECIPES = "the peer systems' recipes for billion-scale LLMs"


def _scale_auto(setting: str, large: str = _PEER_RECIPES) -> str:
    """What "auto" means for `setting`, for its description; `large`: where the billion-scale value comes from."""
    def full_and_lora(full: ScaleDefaults, lora: ScaleDefaults) -> str:
        a, b = (f"{d.value(setting):g}".replace("e-0", "e-") for d in (full, lora))
        return a if a == b else f"{a} ({b} with learner.lora)"

    tiny = f"{TINY.value(setting):g}".replace("e-0", "e-")
    return (f"auto: from the size of the policy (learner/scale_defaults.py): {tiny} under {PRETRAINED_SCALE:,} "
            f"parameters (the tiny model's, measured), {full_and_lora(SMALL_PRETRAINED, SMALL_PRETRAINED_LORA)} "
            f"under {LARGE_SCALE:,} (a small pretrained chat model's, measured on SmolLM2-135M), "
            f"{full_and_lora(PRETRAINED, PRETRAINED_LORA)} from there up ({large})")


class SpoSection(Section):
    rho_min: float = Field(0.875, gt=0, le=1, description="lower bound of the evidence decay; <= rho_max")
    rho_max: float = Field(0.96, gt=0, le=1, description="upper bound of the evidence decay")
    d_half: float = Field(0.06, gt=0, description="drift at which the decay is halfway between rho_max and rho_min")
    normalize: Literal["token", "sequence"] = Field(
        "token", description="SPO++ action-token measure, or SPO's per-episode one")
    sampling_epsilon: float = Field(
        0.05, ge=0, description="floor of the uncertainty weight sqrt(v(1-v)) + eps for prompt sampling")
    drift: Literal["proximal", "updated"] = Field(
        "proximal", description="policy the drift D = mean|log mu - log pi| is measured against. proximal: the "
        "policy being trained when the evidence is folded in, as an asynchronous learner should (mu sampled it, "
        "possibly versions ago). updated: after this step's update, the synchronous SPO code's order. Both are read "
        "from passes every step makes anyway (the training forward, and the one after the update that measures "
        "step_kl)")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> SpoSection:
        require(self.rho_min <= self.rho_max, "rho_min", "need 0 < rho_min <= rho_max <= 1")
        return self


class CriticSection(Section):
    """Value function for turn_gae, token_gae and turn_td (unused by spo, grpo, rloo, gigpo, mars)."""

    mode: Literal["shared", "separate"] = Field(
        "shared", description="value head on the policy backbone, or a model of its own")
    path: str = Field("", description="separate critic's backbone checkpoint; empty: model.path")
    lr: PositiveOrAuto = Field(
        "auto", description="the critic's learning rate, higher than the actor's (Turn-PPO ablations). "
        + _scale_auto("critic.lr"))
    value_coef: float = Field(0.5, ge=0, description="weight of the value loss next to the policy loss (shared mode)")
    value_clip: float = Field(0.2, ge=0, description="c_v of the pessimistic value clip; 0 disables clipping")
    gamma: float = Field(0.99, ge=0, le=1, description="discount")
    lam: float = Field(0.9, ge=0, le=1, description="GAE lambda (turn_td's is 0: one-step temporal-difference targets)")
    turn_ratio: bool = Field(False, description="turn-level geometric-mean importance ratio (MPO / ST-PPO style)")
    whiten: Literal["auto", "batch", "microbatch"] = Field(
        "auto", description="which tokens advantages are whitened over. batch: the whole batch, which needs every "
        "value before the first loss, so one more no-grad forward per step. microbatch: each forward/backward "
        "micro-batch's own tokens (as CleanRL normalises per minibatch); the values then come from the training "
        "forward, no extra pass. auto: microbatch where it equals "
        "batch (one optimizer step per batch, and the step's batch fits one micro-batch), else batch")


class GigpoSection(Section):
    """GiGPO (Feng et al. 2025): a GRPO episode term plus a step term over turns that act from the same
    observation in the episodes of one prompt (docs/estimators.md, "GiGPO")."""

    omega: float = Field(1.0, ge=0, description="weight of the step term: A = A_episode + omega * A_step (the "
                         "paper's and verl-agent's 1)")
    gamma: float = Field(0.95, ge=0, le=1, description="discount of the return-to-go a turn's step term compares "
                         "(verl-agent's 0.95); the episode term reads the undiscounted return")
    normalize: Literal["mean", "std"] = Field(
        "mean", description="mean: both terms are x - group mean (verl-agent's mode mean_norm); std: divided by the "
        "group's unbiased std + 1e-6 as well, as grpo (mean_std_norm), which blows a step group's differences of "
        "discounting alone up to the size of success against failure")


class MarsSection(Section):
    """MARS (Yuan et al. 2025): each turn's reward-to-go against the mean of its agent's turns in the batch, for
    self-play, where the agents share a policy (docs/estimators.md, "MARS")."""

    gamma: float = Field(1.0, ge=0, le=1, description="discount of a turn's reward-to-go over the agent's later "
                         "turns; 1: the rewards still to come, undiscounted")
    normalize: Literal["mean", "std"] = Field(
        "mean", description="mean: reward-to-go minus its agent's mean (MARS's advantage_norm mean); std: divided by "
        "the agent's std as well (mean_std). Either way the token advantages are whitened over the batch after")
    baseline: Literal["seat", "group"] = Field(
        "seat", description="what a turn is compared with: seat, the mean of its agent's turns in the batch (MARS); "
        "group, the mean of its game group's turns of the same seat (the episodes of one prompt_key, as MARSHAL "
        "normalises; needs buffer.sampling = group and tasks.group_size >= 2)")


class LearnerSection(Section):
    estimator: Literal["spo", "turn_gae", "token_gae", "grpo", "rloo", "gigpo", "mars", "turn_td"] = Field(
        "spo", description="advantage estimator; grpo, rloo and gigpo compare the episodes of one prompt in a batch "
        "(gigpo needs them served together: buffer.sampling = group, tasks.group_size >= 2); mars compares each "
        "turn with the same agent's turns in the batch (self-play); turn_td is a turn-level critic with one-step "
        "temporal-difference targets, which may also learn from older episodes (buffer.critic_replay)")
    lr: PositiveOrAuto = Field(
        "auto", description="learning rate. " + _scale_auto("lr"))
    warmup_steps: StepsOrAuto = Field(
        "auto", description="optimizer steps of linear learning-rate warm-up. " + _scale_auto("warmup_steps"))
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    clip_low: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip below 1")
    clip_high: float = Field(0.28, gt=0, description="PPO ratio clip above 1")
    behaviour_weight_cap: float = Field(2.0, ge=1, description="truncated IS on pi_prox / mu")
    behaviour_weight_mode: Literal["truncate", "mask_token", "mask_sequence", "none"] = Field(
        "truncate", description="what to do with the behaviour weight w = pi_prox / mu: truncate at the cap (TIS), "
        "mask tokens or whole sequences (geometric mean) outside [is_mask_low, is_mask_high] (IcePop / AReaL), or "
        "ignore it (none)")
    is_mask_low: float = Field(0.5, ge=0, le=1, description="lower edge of the mask_* window")
    is_mask_high: float = Field(5.0, ge=1, description="upper edge of the mask_* window")
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = Field(
        "token-mean", description="how token losses are averaged")
    entropy_coef: NonNegativeOrAuto = Field(
        "auto", description="bonus on the sampling distribution's entropy (over the allowed-token set, else the "
        "vocabulary), counted in units of its maximum (log of the number of choices). Keeps a model that cannot read "
        "yet out of observation-blind attractors such as \"always one side\" (BENCHMARKS.md, \"The learner learns\", "
        "compares coefficients); a pretrained model generating free text would be paid for rambling. "
        + _scale_auto("entropy_coef"))
    entropy_weight: Literal["uniform", "outcome_variance"] = Field(
        "uniform", description="how the entropy bonus is weighted per episode: uniform, or outcome_variance, "
        "4 v (1 - v) with v SPO's estimate of the episode's task success (estimator spo): full where a task's outcome "
        "is a coin toss, little where it is already settled, so the bonus stops holding a policy near uniform before "
        "its first successes and stops fighting the last steps to a sure answer; but it lets a policy into an "
        "observation-blind trap whose tasks it always wins or always loses (goal_walk) (BENCHMARKS.md, "
        "\"The entropy bonus\")")
    kl_coef: float = Field(0.0, ge=0, description="k3 KL to the frozen initial model in the loss; 0: no reference "
                           "model is loaded")
    agent_norm: bool = Field(False, description="Dr. MAS: normalise advantages per agent id (when batches carry "
                             "agent ids)")
    minibatches: int = Field(1, ge=1, description="optimizer steps per epoch over a batch")
    epochs: int = Field(1, ge=1, description="passes over each batch")
    max_tokens_per_microbatch: TokensOrAuto = Field(
        "auto", description="token budget of one forward/backward (learner/step/packing.py): packed tokens, or rows x "
        "longest episode when pack_sequences is off; it bounds activation memory. An episode longer than the budget "
        "alone is dropped (counted, logged). 0: no budget, the whole minibatch in one micro-batch, which runs a "
        "pretrained model out of memory. An auto budget is never below vllm.max_model_len, so that one whole context "
        "fits; "
        + _scale_auto("max_tokens_per_microbatch", "half the small model's: the smallest billion-scale models hold "
                      "about twice its activations per token"))
    pack_sequences: Literal["auto", True, False] = Field(
        "auto", description="episodes back to back in rows of max_tokens_per_microbatch, no padding (position ids "
        "delimit them); only with a budget. auto: pack where attention skips the other episodes of a row "
        "(flash_attention_2 with cu_seqlens, flex_attention); sdpa and eager compute the row's full square, which "
        "costs more than padding when episodes are short (`turnstream bench learner --pack-sequences` measures it)")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
                        description="auto | cpu | cuda | cuda:N (learner/device.py); auto: cuda when present, else cpu")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="auto: bf16 autocast on cuda (fp32 master weights and AdamW state), fp32 on cpu")
    parallel: Literal["ddp", "fsdp2"] = Field(
        "ddp", description="data parallel over the torchrun ranks (one process: plain training). ddp: every rank "
        "holds the whole model, its gradients and AdamW state. fsdp2: those three are sharded over the ranks "
        "(torch.distributed.fsdp.fully_shard per decoder layer; learner/parallel/fsdp2.py), for models that do not "
        "fit one device; each forward then all-gathers a layer's parameters")
    reshard_after_forward: bool = Field(
        True, description="fsdp2: free each decoder layer's gathered parameters after its forward and gather them "
        "again for its backward (least memory). false: keep them until the backward, one all-gather per layer and "
        "micro-batch instead of two, for a model's worth of parameters more at the peak (`turnstream bench learner "
        "--parallel --keep-gathered` measures the trade)")
    activation_checkpointing: bool = Field(
        False, description="recompute each decoder layer in backward: less memory, ~1/3 more compute")
    attn_implementation: str = Field(
        "auto", description="auto: flash_attention_2 on cuda if installed, else sdpa; or any Hugging Face name")
    max_steps: int = Field(0, ge=0, description="0: run until stopped")
    batch_max_tokens: int = Field(
        0, ge=0, description="token budget of one batch (observation + generated tokens): the buffer fills a batch "
        "up to it, with at most buffer.batch_episodes episodes; 0: exactly buffer.batch_episodes episodes")
    cpus: CpuIds = Field(default_factory=list, description="CPU ids this role is pinned to; empty: any")
    torch_threads: int = Field(
        0, ge=0, description="torch.set_num_threads; 0: torch's default (a thread per core the process may run on, "
        "or OMP_NUM_THREADS, which torchrun sets to 1 for several ranks on a node). The count used is recorded "
        "(learner.record), because it sets the order of the sums and a bit-exact replay needs the same")
    weights_dir: str = Field("", description="where pushed weights are written; empty: <run_dir>/weights")
    keep_weight_versions: int = Field(2, ge=1, description="pushed versions kept on disk")
    push_bucket_mb: int = Field(
        512, ge=0, description="a push reads the weights in buckets of this many MiB (learner/weights/buckets.py): "
        "under fsdp2 each bucket is gathered from the shards and dropped before the next, so no rank holds more "
        "of the full weights than one bucket (a larger tensor is a bucket alone); the disk backend writes one "
        "safetensors file per bucket, nccl broadcasts bucket after bucket. Larger: fewer, bigger transfers; "
        "smaller: less memory. 0: the whole model in one bucket")
    overlap_push: Literal["auto", True, False] = Field(
        "auto", description="push version v into the servers while step v+1 trains (learner/serve.py): the push's "
        "time leaves the learner's critical path, and data may be one version staler. auto: with the disk backend "
        "(pushes read a saved snapshot) when buffer.eta >= 1; the synchronous baseline (eta 0) never overlaps")
    checkpoint_every: int = Field(0, ge=0, description="steps between checkpoints under <run_dir>/checkpoints; "
                                  "0: never")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept")
    resume: bool = Field(True, description="on start, continue from the latest checkpoint in <run_dir>/checkpoints")
    record: bool = Field(
        False, description="keep every step's batch as served, with its version and RNG state, under <run_dir>/record, "
        "so that `turnstream replay` retrains the run bit for bit and `turnstream inspect` shows any step "
        "(docs/reproduce.md). Off by default: it costs disk (BENCHMARKS.md, \"Recording a run\")")
    metrics_port: Port = Field(0, description="/metrics port; 0: the launcher picks one")
    spo: SpoSection = Field(default_factory=SpoSection, description="the spo estimator")
    critic: CriticSection = Field(default_factory=CriticSection, description="the value function of turn_gae, "
                                  "token_gae and turn_td")
    gigpo: GigpoSection = Field(default_factory=GigpoSection, description="the gigpo estimator")
    mars: MarsSection = Field(default_factory=MarsSection, description="the mars estimator")
    lora: LoraSection | None = Field(
        None, description="train low-rank adapters only, the base frozen and never pushed again (learner/lora.py); "
        "unset: every weight trains")

    def values_in_step(self, one_microbatch: bool) -> bool:
        """Whether a value-based step reads the critic in its training forward (critic.whiten resolved), for a
        step whose batch is `one_microbatch` or not."""
        if self.critic.whiten == "auto":
            return self.epochs * self.minibatches == 1 and one_microbatch
        return self.critic.whiten == "microbatch"

    @field_validator("estimator", mode="before")
    @classmethod
    def _renamed(cls, value):
        if value == "archer":
            raise ValueError("archer was renamed turn_td: it is turn-level GAE with lambda 0 and critic replay, not "
                             "ArCHer's utterance-level Q and V with target networks (docs/estimators.md, \"turn_td\")")
        return value

    @model_validator(mode="after")
    def _cross_field_rules(self) -> LearnerSection:
        require(self.critic.whiten != "microbatch" or self.epochs * self.minibatches == 1, "critic.whiten",
                "microbatch reads the critic in the training forward, which needs one optimizer step per batch "
                "(epochs = minibatches = 1)")
        require(self.entropy_weight != "outcome_variance" or self.estimator == "spo", "entropy_weight",
                "outcome_variance weighs by SPO's per-task success estimate, which needs estimator = \"spo\"")
        return self
